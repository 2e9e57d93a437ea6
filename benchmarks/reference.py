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
and fit time. Results go to ``--out`` (``benchmarks/suite.py``'s result, its data one entry
per data set, merged with what the file held).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import suite
import torch

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


def _cells(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return "-" if value is None else str(value)


def report(results: dict) -> list[str]:
    """The tables of ``results`` (``{key: run's result}``): per key its reference's settings
    and convergence, then each row of its ``zoo.compare`` table."""
    lines = []
    for key, result in results.items():
        ref = result["reference"]
        lines += ["", f"{key}: {ref['chains']} chains of {ref['warmup']} + {ref['draws']} NUTS "
                  f"transitions (tree depth cap {ref['max_tree_depth']}, mean "
                  f"{ref['mean_tree_depth']:.2f}), {ref['divergences']} divergences, R-hat lp "
                  f"{ref['lp_r_hat']:.3f} / worst output {ref['outputs_r_hat']:.3f}, bulk ESS lp "
                  f"{ref['lp_ess_bulk']:.0f} / worst output {ref['outputs_ess_bulk']:.0f}",
                  ""]  # fmt: skip
        table = result["table"]
        columns = [c for c in next(iter(table.values())) if c not in SKIPPED]
        rows = [[label, *(_cells(row.get(c)) for c in columns)] for label, row in table.items()]
        lines += suite.markdown(["row", *columns], rows)
    return lines


SKIPPED = ("steps_per_second", "final_elbo")


def save_each(keys, run_one, name: str, out, argv=None) -> None:
    """``run_one(key)`` for each key, merged into the data of ``name``'s result at ``out`` (what
    it held is kept) and written after each with :func:`report`'s tables, so an interrupted
    run keeps what it finished."""
    print(f"load: {os.getloadavg()}, cores: {len(os.sched_getaffinity(0))}")
    saved = suite.load(name, out=out)
    results = dict(saved["data"]) if saved else {}
    lines = report(results)
    for key in keys:
        results[str(key)] = run_one(key)
        lines = report(results)
        suite.save(name, lines, results, out, argv, earlier=suite.commands(saved))
    print("\n".join(lines))
    print(f"\nwritten {out or suite.RESULTS / (name + '.json')}; load after: {os.getloadavg()}")


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
    parser.add_argument("--out", help="default: benchmarks/results/reference.json")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    save_each(args.datasets, lambda name: run(name, args), "reference", args.out, argv)


if __name__ == "__main__":
    main()
