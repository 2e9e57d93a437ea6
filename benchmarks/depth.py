"""Does structure matter with depth? Every kind of posterior family against an HMC reference on
MLPs of one to four hidden layers of the same width (issue 49; notebook 09).

Farquhar et al. (NeurIPS 2020, "Liberty or depth") argue that for deep enough networks a
mean-field posterior can match the structured ones. Here the diabetes regression of
``benchmarks/reference.py`` (354 training points, standardised) is fitted by MLPs of 10 inputs
and ``depth`` hidden layers of 16 units under the regression default prior ``N(0, 2 / fan_in)``
(``zoo.priors.default_prior("regression")``, He's scale for ReLU); each depth gets its
own HMC reference (Pyro's NUTS, its chains checkpointed under ``--workdir``, so a rerun reads
them back) and every family is fitted as ``zoo.compare`` does, with the distance of its
predictive to HMC's (W2 between the predictive Gaussians, averaged over the test points) and the
ratio of its predictive standard deviation to HMC's. The families: mean field (diagonal), one
weight tensor at a time (low rank, matrix normal, WHVI), across layers (one full Gaussian over
every weight, ``guides.AutoJoint``) and a subnetwork (256 weights by magnitude, point masses on
the rest).

Run: ``python benchmarks/depth.py`` (its result: ``benchmarks/results/depth.json``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import against_reference, load, save_each  # noqa: E402

import zoo  # noqa: E402

DEPTHS = (1, 2, 3, 4)
WIDTH = 16
#: (label, family, guide options), by kind: mean field, per tensor, across layers, subnetwork.
FAMILIES = [
    ("diagonal", "diagonal", {}),
    ("lowrank", "lowrank", {}),
    ("matrix_normal", "matrix_normal", {}),
    ("whvi", "whvi", {}),
    ("joint (all weights)", "joint", {}),
    # the family's default size: 256 weights, or every weight of a smaller network (depth 1
    # has 193); a size given above a network's weights is refused
    ("subnetwork S=256", "subnetwork", {}),
]


def network(depth: int, in_features: int = 10):
    """The MLP of ``depth`` hidden layers of :data:`WIDTH` units, with the regression default
    prior and a learned noise."""
    return zoo.models.BayesianMLP(in_features, (WIDTH,) * depth)


def run(depth: int, args) -> dict:
    train, test, _, options = load("diabetes", args.seed)
    if args.num_steps is not None:
        options = {**options, "num_steps": args.num_steps}

    def factory():
        return network(depth, train[0].shape[1])

    folder, title = f"depth{depth}", f"depth {depth}"
    return against_reference(factory, FAMILIES, train, test, options, args, folder, title)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", nargs="+", type=int, default=list(DEPTHS))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--max-tree-depth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="benchmarks/results/reference-chains")
    parser.add_argument("--out", help="default: benchmarks/results/depth.json")
    parser.add_argument("--num-steps", type=int, help="default: zoo.REGRESSION_FIT's")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    save_each(args.depths, lambda depth: run(depth, args), "depth", args.out, argv)


if __name__ == "__main__":
    main()
