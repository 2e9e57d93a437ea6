"""Time posterior prediction: S sampled networks on MNIST test images, batched vs a loop.

    python benchmarks/predict_time.py --data ../shared/datasets               # LeNet-5, S = 200
    python benchmarks/predict_time.py --net mlp --images 10000 --samples 200

For each family the same S weight draws are evaluated three ways: ``zoo.predict`` with
``sample_batch_size=32`` (``vmap`` over blocks of 32 draws x 512 images), ``zoo.predict``'s
default (one draw per pass, 512 images per pass on the CPU and 8192 on CUDA), and a plain
Python loop over the S draws (one forward of all images per draw). A fourth column times the
loop a Pyro user writes, ``pyro.infer.Predictive(model, guide=guide, num_samples=S)``
(sequential: one guide and one model trace per draw; it draws its own weights, so only its
time is compared; ``--no-pyro`` skips it). The table gives seconds, speed-ups over the loop,
and the floating-point rate the loop reaches (operations counted by
``torch.utils.flop_counter``) next to this machine's rate for one large matrix product: when
the loop already runs near that rate, no batching of the same arithmetic can be much faster.
The guides are freshly initialised (prediction cost does not depend on the fitted values).
"""

from __future__ import annotations

import argparse
import time

import pyro
import suite
import torch
from torch.utils.flop_counter import FlopCounterMode

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


def matmul_gflops(device, size: int = 2048, repeats: int = 5) -> float:
    """This machine's rate for one ``size``-cubed float32 matrix product (best of ``repeats``)."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def forward_flops(model, x, params) -> int:
    """Floating-point operations of one sampled network on all of ``x``."""
    chunk = x[:512]
    with FlopCounterMode(display=False) as counter:
        model.network(chunk, params)
    return counter.get_total_flops() * len(x) // len(chunk)


def pyro_predictive_time(model, guide, x, samples, device) -> float:
    """Seconds for ``pyro.infer.Predictive`` (sequential) to give S output draws on ``x``."""
    predictive = pyro.infer.Predictive(
        model, guide=guide, num_samples=samples, return_sites=("_RETURN",)
    )
    start = time.perf_counter()
    out = predictive(x)["_RETURN"]
    probs = out.softmax(-1).mean(0)
    sync(device)
    assert probs.shape == (len(x), out.shape[-1])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="lenet5", choices=("lenet5", "mlp"))
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--data", default=None, help="data root (default: $ZOO_DATA)")
    parser.add_argument("--families", nargs="+", default=guides.available())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-pyro", action="store_true", help="skip the pyro Predictive column")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/predict_time.json")
    args = parser.parse_args()
    with suite.record("predict_time", args.out):
        device = torch.device(args.device)
        x = zoo.data.mnist(args.data, train=False, limit=args.images).tensors[0].to(device)
        peak = matmul_gflops(device)
        print(f"\n{args.net}, {len(x)} images, S = {args.samples}, {device}")
        print(f"one 2048^3 float32 matrix product here: {peak:.0f} GFLOP/s\n")
        print(
            "| family | vmap, 32 draws per pass (s) | zoo.predict default (s) | loop (s) "
            "| pyro Predictive (s) | loop / vmap | loop / default | pyro Predictive / default "
            "| loop GFLOP/s |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for family in args.families:
            model = make_model(args.net).to(device)
            guide = guides.get(family)(model)
            with torch.no_grad():
                guide(x[:2], torch.zeros(2, dtype=torch.long, device=device))
                draws = guide.sample_posterior(args.samples)
                zoo.predict(
                    model,
                    guide,
                    x[:64],
                    params={k: v[:4] for k, v in draws.items()},
                    progress=False,
                )
                start = time.perf_counter()
                batched = zoo.predict(
                    model,
                    guide,
                    x,
                    params=draws,
                    sample_batch_size=32,
                    batch_size=512,
                    progress=False,
                ).probs
                sync(device)
                t_batched = time.perf_counter() - start
                start = time.perf_counter()
                default = zoo.predict(model, guide, x, params=draws, progress=False).probs
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
                flops = forward_flops(model, x, {k: v[0] for k, v in draws.items()}) * args.samples
                t_pyro = (
                    float("nan")
                    if args.no_pyro
                    else pyro_predictive_time(model, guide, x, args.samples, device)
                )
            assert torch.allclose(batched, looped, atol=1e-4)
            assert torch.allclose(default, looped, atol=1e-4)
            print(
                f"| {family} | {t_batched:.2f} | {t_default:.2f} | {t_loop:.2f} | {t_pyro:.2f} "
                f"| {t_loop / t_batched:.2f} | {t_loop / t_default:.2f} | {t_pyro / t_default:.2f} "
                f"| {flops / t_loop / 1e9:.0f} |"
            )


if __name__ == "__main__":
    main()
