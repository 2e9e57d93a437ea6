"""How long the ArviZ bridge takes on LeNet-5 (106,680 weights): the README's figures.

    python benchmarks/arviz_time.py                 # 200 draws, 1,000 test-like inputs
    python benchmarks/arviz_time.py --skip-summary  # without the slow per-weight az.summary

A LeNet-5 diagonal guide (fitted for a few steps on random images: the timings depend on the
sizes, not on the values) is turned into InferenceData with ``to_arviz``; then
``zoo.arviz.layer_summary`` and ``az.summary(kind="stats")`` over every weight are timed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import zoo
import zoo.arviz as zaz


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--skip-summary", action="store_true")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.points, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.points,), generator=g)
    fit = zoo.fit(
        zoo.models.LeNet5(),
        "diagonal",
        (x, y),
        num_steps=3,
        run=zoo.Run(progress=False),
    )
    weights = sum(p.numel() for p in fit.model.net.parameters())
    _, t_posterior = timed(lambda: fit.to_arviz(num_samples=args.draws, progress=False))
    idata, t_idata = timed(lambda: fit.to_arviz((x, y), num_samples=args.draws, progress=False))
    _, t_layer = timed(lambda: zaz.layer_summary(idata))
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average), {torch.get_num_threads()} threads")
    print(f"LeNet-5, {weights:,} weights, {args.draws} draws, {args.points} inputs")
    print(f"| to_arviz, posterior only | {t_posterior:.2f} s |")
    print(f"| to_arviz with {args.points} inputs (predictive, log-likelihood) | {t_idata:.2f} s |")
    print(f"| zoo.arviz.layer_summary | {t_layer:.2f} s |")
    if not args.skip_summary:
        _, t_summary = timed(lambda: zaz.summary(idata))
        print(f"| az.summary(kind='stats'), every weight | {t_summary:.1f} s |")


if __name__ == "__main__":
    main()
