"""The ELBO a fit reaches, estimated with many draws: the joint Gaussian against the diagonal
family on the depth study's networks (issue 60).

    python benchmarks/joint_elbo.py --depth 4 --families diagonal joint

A fit's ``final_elbo`` is the last step's single-draw estimate; at a thousand weights its spread
over draws is about 25 nats, more than the difference between two families. Here each family
is fitted as ``benchmarks/depth.py`` fits it (diabetes, ``depth`` hidden layers of 16 units,
``zoo.REGRESSION_FIT``, seed 0) and its ELBO is then estimated with Pyro's ``Trace_ELBO`` over
``--draws`` independent draws: the mean, its standard error and the spread of one draw.
"""

from __future__ import annotations

import argparse
import os
import sys

import pyro
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from depth import network  # noqa: E402
from reference import load  # noqa: E402

import zoo  # noqa: E402
from zoo.inference.objective import loss_context  # noqa: E402


def estimate(fit, data, draws: int, seed: int = 1) -> tuple[float, float, float]:
    """``(-ELBO mean, its standard error, one draw's standard deviation)`` of a fit."""
    with loss_context(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        values = torch.tensor(
            [pyro.infer.Trace_ELBO().loss(fit.model, fit.guide, *data) for _ in range(draws)],
            dtype=torch.float64,
        )
    return values.mean().item(), values.std().item() / draws**0.5, values.std().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--families", nargs="+", default=["diagonal", "joint"])
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args(argv)
    train, test, _, _ = load("diabetes", 0)
    for family in args.families:
        fit = zoo.fit(network(args.depth), family, train, seed=0, run=zoo.Run(progress=False))
        mean, error, spread = estimate(fit, train, args.draws)
        metrics = fit.evaluate(test, seed=0, progress=False)
        print(
            f"depth {args.depth} {family}: -ELBO {mean:.1f} +- {error:.1f} over {args.draws} "
            f"draws (one draw's sd {spread:.1f}; last step {-fit.final_elbo:.1f}); test RMSE "
            f"{metrics['rmse']:.4f}, NLL {metrics['nll']:.4f}; {fit.wall_time:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
