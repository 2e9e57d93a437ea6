"""Why the tridiagonal family is far from HMC on two moons (benchmarks/reference.py's moons):
its fit at the benchmark's recipe, with 10,000 steps, and with the correlation parameters'
learning rate 50x, beside the diagonal family; test metrics and the final -ELBO.

    python benchmarks/tridiagonal_moons.py
"""

from __future__ import annotations

import os

from reference import load  # benchmarks/reference.py, run from the benchmarks folder or root

import zoo
from zoo.training.options import grouped

RUNS = [
    ("tridiagonal", "tridiagonal", {}),
    ("tridiagonal, 10,000 steps", "tridiagonal", {"num_steps": 10_000}),
    ("tridiagonal, gamma lr x50", "tridiagonal", {"lr_multipliers": {"*.gamma*": 50.0}}),
    ("diagonal", "diagonal", {}),
]


def main() -> None:
    print(f"load: {os.getloadavg()}")
    train, test, factory, options = load("moons")
    print("| run | accuracy | NLL | ECE | final -ELBO | fit s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, family, extra in RUNS:
        fit = zoo.fit(
            factory(), family, train, seed=0, **grouped({"progress": False, **options, **extra})
        )
        m = fit.evaluate(test, progress=False)
        print(
            f"| {label} | {m['accuracy']:.3f} | {m['nll']:.3f} | {m['ece']:.3f} | "
            f"{fit.losses[-1]:.1f} | {fit.wall_time:.0f} |"
        )


if __name__ == "__main__":
    main()
