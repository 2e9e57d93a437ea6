"""Time posterior prediction: S sampled networks on MNIST test images, batched vs a loop.

    python benchmarks/predict_time.py --data ../shared/datasets               # LeNet-5, S = 200
    python benchmarks/predict_time.py --net mlp --images 10000 --samples 200

For each family the same S weight draws are evaluated three ways: ``zoo.predict`` with
``sample_batch_size=32`` (``vmap`` over blocks of 32 draws x 512 images), ``zoo.predict``'s
default (one draw per pass, 512 images per pass on the CPU and 8192 on CUDA), and a plain
Python loop over the S draws (one forward of all images per draw). The table gives seconds
and speed-ups over the loop. The guides are freshly initialised (prediction cost does not
depend on the fitted values).
"""

from __future__ import annotations

import argparse
import time

import torch

import guides
import zoo
from zoo.models.mlp import mlp_network


def make_model(net: str):
    if net == "lenet5":
        return zoo.models.LeNet5()
    return zoo.models.BayesianModel(
        torch.nn.Sequential(torch.nn.Flatten(), *mlp_network(784, (400, 400), 10)),
        task="classification",
        input_shape=(1, 28, 28),
    )


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="lenet5", choices=("lenet5", "mlp"))
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--data", default=None, help="data root (default: $ZOO_DATA)")
    parser.add_argument("--families", nargs="+", default=guides.available())
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    x = zoo.data.mnist(args.data, train=False, limit=args.images).tensors[0].to(device)
    print(f"\n{args.net}, {len(x)} images, S = {args.samples}, {device}\n")
    print(
        "| family | vmap, 32 draws per pass (s) | zoo.predict default (s) | loop (s) "
        "| loop / vmap | loop / default |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for family in args.families:
        model = make_model(args.net).to(device)
        guide = guides.get(family)(model)
        with torch.no_grad():
            guide(x[:2], torch.zeros(2, dtype=torch.long, device=device))
            draws = guide.sample_posterior(args.samples)
            zoo.predict(model, guide, x[:64], params={k: v[:4] for k, v in draws.items()})
            start = time.perf_counter()
            batched = zoo.predict(
                model, guide, x, params=draws, sample_batch_size=32, batch_size=512
            ).probs
            sync(device)
            t_batched = time.perf_counter() - start
            start = time.perf_counter()
            default = zoo.predict(model, guide, x, params=draws).probs
            sync(device)
            t_default = time.perf_counter() - start
            start = time.perf_counter()
            total = 0
            for s in range(args.samples):
                out = model.network(x, {k: v[s] for k, v in draws.items()})
                total = total + out.softmax(-1)
            looped = total / args.samples
            sync(device)
            t_loop = time.perf_counter() - start
        assert torch.allclose(batched, looped, atol=1e-4)
        assert torch.allclose(default, looped, atol=1e-4)
        print(
            f"| {family} | {t_batched:.2f} | {t_default:.2f} | {t_loop:.2f} "
            f"| {t_loop / t_batched:.2f} | {t_loop / t_default:.2f} |"
        )


if __name__ == "__main__":
    main()
