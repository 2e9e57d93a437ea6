"""Every posterior family against an HMC reference on bundled data sets (issue 33).

    python benchmarks/reference.py                       # the table in benchmarks/README.md
    python benchmarks/reference.py --datasets moons --chains 2 --warmup 100 --draws 100

Per data set, a seeded 80/20 split standardised on its training part, and a small MLP that
full-batch NUTS samples well on two cores:

- ``diabetes`` (scikit-learn; 442 x 10 -> 1, regression): 10-16-1 ReLU with a learned noise
  and the regression default prior ``N(0, 2 / fan_in)``; targets standardised, metrics and
  distances in standardised units.
- ``digits`` (scikit-learn 8x8 digits; 1,797 x 64 -> 10 classes): 64-16-10 ReLU, ``N(0, 1)``.
- ``moons`` (scikit-learn ``make_moons``, 400 points, noise 0.2, two classes): 2-16-16-2 ReLU,
  ``N(0, 1)``.

The reference is ``zoo.reference`` (``--chains`` chains of ``--warmup`` + ``--draws``
transitions, NUTS' tree depth capped at ``--max-tree-depth``), checkpointed under
``--workdir`` so that a stopped run resumes. Its convergence is printed: divergences, the
R-hat and bulk ESS of ``lp`` and the worst over the test outputs (function space). Every family
of ``guides.available()`` and the notable variants are then fitted with the same data, seed and
options and tabulated by ``zoo.compare(..., reference=ref)``: agreement and total variation
(classification) or W2, sd ratio and reference coverage (regression), beside test metrics
and fit time. Results go to ``--out`` (JSON), one entry per data set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from saving import write_json

import guides
import zoo
from zoo.training.options import grouped

DATASETS = ("diabetes", "digits", "moons")
#: Variants beside each family's defaults: a rank-2 factor (the default is 10), MC dropout at
#: the rate Gal & Ghahramani used on UCI regression (the family's default is 0.1), and WHVI with
#: a diagonal covariance of g (the default is full).
VARIANTS = [
    ("lowrank r=2", "lowrank", {"rank": 2}),
    ("mc_dropout p=0.05", "mc_dropout", {"p": 0.05}),
    ("whvi diagonal q(g)", "whvi", {"covariance": "diagonal"}),
]
#: The field's baselines as rows (``zoo.compare``): Laplace through laplace-torch (last-layer
#: KFAC; all weights with a full Hessian, which these small networks allow) and 5 MAP nets.
BASELINES = [
    ("laplace LL-KFAC", "laplace", {"prior_precision": "marglik"}),
    (
        "laplace full",
        "laplace",
        {"weights": "all", "hessian": "full", "prior_precision": "marglik"},
    ),
    ("ensemble 5 MAP", "ensemble", {"members": 5}),
]


def load(name: str, seed: int = 0):
    """``(train, test, model_factory, fit_options)`` of a data set."""
    from sklearn import datasets

    if name == "diabetes":
        x, y = datasets.load_diabetes(return_X_y=True)
    elif name == "digits":
        x, y = datasets.load_digits(return_X_y=True)
    elif name == "moons":
        x, y = datasets.make_moons(n_samples=400, noise=0.2, random_state=seed)
    else:
        raise ValueError(f"unknown data set {name!r}; choose from {DATASETS}")
    x = torch.tensor(x, dtype=torch.float32)
    regression = name == "diabetes"
    y = torch.tensor(y, dtype=torch.float32 if regression else torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = round(0.2 * len(x))
    test, train = perm[:n_test], perm[n_test:]
    mean, sd = x[train].mean(0), x[train].std(0).clamp_min(1e-3)
    x = (x - mean) / sd
    if regression:
        y = (y - y[train].mean()) / y[train].std()
        factory = lambda: zoo.models.BayesianMLP(10, (16,))  # noqa: E731
        options = {}  # zoo.REGRESSION_FIT: full batch, 3,000 steps
    else:
        classes = int(y.max()) + 1
        hidden = (16,) if name == "digits" else (16, 16)
        factory = lambda: zoo.models.BayesianMLP(  # noqa: E731
            x.shape[1], hidden, classes, task="classification"
        )
        options = {"num_steps": 3000, "batch_size": min(128, len(train)), "lr": 1e-2}
    return (x[train], y[train]), (x[test], y[test]), factory, options


def run(name: str, args) -> dict:
    train, test, factory, options = load(name, args.seed)
    named = {label: row for label, *row in [*VARIANTS, *BASELINES]}
    families = [(f, *named[f]) if f in named else f for f in args.families or []]
    families = families or [*guides.available(), *VARIANTS, *BASELINES]
    title = f"{name}: {len(train[0])} train / {len(test[0])} test"
    return against_reference(factory, families, train, test, options, args, name, title)


def against_reference(factory, families, train, test, options, args, folder, title) -> dict:
    """The HMC reference of ``factory()`` on ``train`` (its chains checkpointed in
    ``args.workdir / folder``, read back when there) and ``zoo.compare``'s table of
    ``families`` against it: ``{"reference": settings and diagnostics, "table": rows}``.
    ``args`` holds ``chains``, ``warmup``, ``draws``, ``max_tree_depth``, ``seed``, ``quiet``."""
    start = time.perf_counter()
    ref = zoo.reference(
        factory(),
        train,
        chains=args.chains,
        warmup=args.warmup,
        draws=args.draws,
        seed=args.seed,
        sampler=zoo.NUTS(max_tree_depth=args.max_tree_depth),
        checkpoint=Path(args.workdir) / folder,
        progress=not args.quiet,
    )
    sampled = time.perf_counter() - start
    diagnostics = ref.diagnostics(test[0])
    depth = ref.stats["tree_depth"].mean().item()
    print(f"\n== {title}; reference {ref}")
    print(f"   convergence {diagnostics}; mean tree depth {depth:.2f}; {sampled:.0f} s this call")
    table = zoo.compare(
        factory,
        families,
        train,
        test,
        reference=ref,
        progress=False,
        seed=args.seed,
        **grouped(options),
    )
    show = [c for c in table.columns if c not in ("steps_per_second", "final_elbo")]
    print(table[show].to_string(float_format=lambda v: f"{v:.4g}"))
    return {
        "reference": {
            "chains": args.chains,
            "warmup": args.warmup,
            "draws": args.draws,
            "max_tree_depth": args.max_tree_depth,
            "wall_time": ref.wall_time,
            "mean_tree_depth": depth,
            **diagnostics,
        },
        "table": json.loads(table.to_json(orient="index")),
    }


def save_each(keys, run_one, out) -> None:
    """``run_one(key)`` for each key, the results merged into the JSON file ``out`` (what it
    held is kept) and written after each, so an interrupted run keeps what it finished."""
    print(f"load: {os.getloadavg()}, cores: {len(os.sched_getaffinity(0))}")
    out = Path(out)
    results = json.loads(out.read_text()) if out.exists() else {}
    for key in keys:
        results[str(key)] = run_one(key)
        write_json(results, out)
    print(f"\nwritten {out}; load after: {os.getloadavg()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument(
        "--families",
        nargs="+",
        help="family names, or the labels of VARIANTS and BASELINES (default: all of them)",
    )
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--max-tree-depth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="benchmarks/results/reference-chains")
    parser.add_argument("--out", default="benchmarks/results/reference.json")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    save_each(args.datasets, lambda name: run(name, args), args.out)


if __name__ == "__main__":
    main()
