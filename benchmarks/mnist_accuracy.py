"""Fit LeNet-5 on the full MNIST with one posterior family and print the test metrics.

python benchmarks/mnist_accuracy.py --guide diagonal --epochs 2 --data ../shared/datasets
"""

from __future__ import annotations

import argparse
import time

import guides
import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guide", default="diagonal", choices=guides.available())
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100, help="posterior samples per image")
    parser.add_argument("--data", default=None, help="data root (default: $ZOO_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    train = zoo.data.mnist(args.data)
    test = zoo.data.mnist(args.data, train=False)
    fit = zoo.fit(
        zoo.models.LeNet5(), args.guide, train, epochs=args.epochs, seed=args.seed, progress=False
    )
    start = time.perf_counter()
    metrics = fit.evaluate(test, num_samples=args.samples)
    eval_time = time.perf_counter() - start
    print(f"| guide | epochs | steps | fit s | eval s | {' | '.join(metrics)} |")
    print("|" + " --- |" * (5 + len(metrics)))
    values = " | ".join(f"{v:.4f}" for v in metrics.values())
    print(
        f"| {args.guide} | {args.epochs} | {fit.steps} | {fit.wall_time:.1f} | {eval_time:.1f} "
        f"| {values} |"
    )


if __name__ == "__main__":
    main()
