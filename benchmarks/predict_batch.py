"""Inputs per prediction pass on the CPU: zoo.predict's default against a fixed 512.

    python benchmarks/predict_batch.py

For LeNet-5, the CIFAR net and the MLP, the same posterior draws are evaluated with
``batch_size=512`` and with the default (``zoo.evaluation.predictive.cpu_batch_size``: as many
inputs as keep a pass's largest activation within a third of the last-level cache), interleaved,
and the best of ``--rounds`` is reported with the speed-up. Random inputs: the time does not depend
on the values.
"""

from __future__ import annotations

import argparse
import time

import torch

import guides
import zoo
from zoo.evaluation.predictive import cpu_batch_size
from zoo.models.mlp import mlp_network


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best of)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    nets = {
        "LeNet-5, 2000 images, 40 draws": (zoo.models.LeNet5(), (2000, 1, 28, 28), 40),
        "CIFAR net, 1000 images, 20 draws": (zoo.models.CifarNet(), (1000, 3, 32, 32), 20),
        "MLP 784-400-400-10, 10000 images, 40 draws": (
            zoo.models.BayesianModel(mlp_network(784, (400, 400), 10), task="classification"),
            (10000, 784),
            40,
        ),
    }
    print(f"cpu, {torch.get_num_threads()} threads, best of {args.rounds}\n")
    print("| net | inputs per pass (default) | 512 per pass (s) | default (s) | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (model, shape, samples) in nets.items():
        x = torch.randn(shape)
        guide = guides.AutoDiagonal(model)
        with torch.no_grad():
            guide(x[:2], torch.zeros(2, dtype=torch.long))
            draws = guide.sample_posterior(samples)
        fixed, default = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            zoo.predict(model, guide, x, params=draws, batch_size=512, progress=False)
            fixed.append(time.perf_counter() - start)
            start = time.perf_counter()
            zoo.predict(model, guide, x, params=draws, progress=False)
            default.append(time.perf_counter() - start)
        chosen = cpu_batch_size(model, x, draws)
        print(
            f"| {name} | {chosen} | {min(fixed):.2f} | {min(default):.2f} | "
            f"{min(fixed) / min(default):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
