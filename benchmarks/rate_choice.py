"""How a fit given no rate should find one: the field's answers side by side (issue 69).

    python benchmarks/rate_choice.py                 # the table in benchmarks/README.md
    python benchmarks/rate_choice.py --problem mnist --seeds 0

On one problem of ``benchmarks/fairness.py`` (the digits by default: a 64-32-10 MLP, 10 epochs of
1,438 digits at batch 128, 120 steps), per family and seed, the test NLL and accuracy of:

- ``fixed 3e-3``: the task's rate times the family's scale, decaying tenfold (the default of
  release 0.3);
- ``range test``: ``zoo.fit``'s default (:mod:`zoo.training.rate`), its steps charged;
- ``Prodigy``: the learning-rate-free Adam of Mishchenko & Defazio (``prodigyopt``, ``lr=1``),
  decaying tenfold over the run as the others do, and at a constant rate;
- ``MAP warm start``: a quarter of the steps fitting the point estimate at the fixed rate, then
  the family from those means for the rest (its ``init_loc_fn``), at the fixed rate (not WHVI,
  which takes no given means; the MAP row is its fixed-rate fit).

The schedule-free optimisers (``schedulefree``) are not rows: they evaluate at an average of the
iterates that the optimiser swaps in only on its ``eval()``, a call a fit's optimiser interface
does not make, and still take a rate. Rows whose package is not installed are left out.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FAMILIES = ("diagonal", "lowrank", "tridiagonal", "whvi", "mc_dropout", "map")


def rows() -> dict:
    """``{label: (lr, optim options, warm start)}`` of every rule this machine can run."""
    out = {
        "fixed 3e-3": ("fixed", {"lr_schedule": "exponential"}, False),
        "range test": (None, {}, False),
    }
    try:
        import prodigyopt

        out["Prodigy, decaying"] = (1.0, {"optimizer": prodigyopt.Prodigy,
                                          "lr_schedule": "exponential"}, False)  # fmt: skip
        out["Prodigy, constant"] = (1.0, {"optimizer": prodigyopt.Prodigy}, False)
    except ImportError:
        pass
    out["MAP warm start, fixed 3e-3"] = ("fixed", {"lr_schedule": "exponential"}, True)
    return out


def run(problem_name: str, family: str, label: str, seed: int) -> dict:
    from fairness import problem

    import guides
    import zoo

    train, test, factory, options, default_lr = problem(problem_name)
    lr, optim, warm = rows()[label]
    if lr == "fixed":
        lr = default_lr * guides.recipe(family).scale(full_batch=False)
    args = dict(options, seed=seed, run=zoo.Run(progress=False), optim=zoo.Optim(**optim))
    guide = family
    start = time.perf_counter()
    if warm and family == "whvi":  # it takes no given means (guides.AutoWHVI refuses them)
        return {"family": family, "rule": label, "seed": seed, "nll": math.nan,
                "accuracy": math.nan, "lr": lr, "seconds": 0.0}  # fmt: skip
    if warm and family != "map":
        steps = (options["epochs"] * math.ceil(len(train[0]) / options["batch_size"])) // 4
        first = zoo.fit(factory(), "map", train, **{**args, "epochs": None},
                        num_steps=steps, lr=lr)  # fmt: skip
        means = {k: v.detach() for k, v in first.guide.median().items()}
        guide = guides.family(family, init_loc_fn=lambda site: means[site["name"]])
        args = {**args, "epochs": None, "num_steps": 3 * steps}
    fit = zoo.fit(factory(), guide, train, lr=lr, **args)
    metrics = fit.evaluate(test, num_samples=100, progress=False)
    return {
        "family": family,
        "rule": label,
        "seed": seed,
        "nll": float(metrics["nll"]),
        "accuracy": float(metrics.get("accuracy", math.nan)),
        "lr": fit.options["lr"],
        "seconds": time.perf_counter() - start,
    }


def table_lines(results: list[dict]) -> list[str]:
    """Mean test NLL (and accuracy) over the seeds, a row per family, a column per rule."""
    labels = list(dict.fromkeys(r["rule"] for r in results))
    lines = ["| family | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    for family in dict.fromkeys(r["family"] for r in results):
        cells = []
        for label in labels:
            mine = [r for r in results if r["family"] == family and r["rule"] == label]
            if not mine or any(math.isnan(r["nll"]) for r in mine):
                cells.append("-")
                continue
            nll = sum(r["nll"] for r in mine) / len(mine)
            acc = sum(r["accuracy"] for r in mine) / len(mine)
            cells.append(f"{nll:.3f} ({acc:.3f})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default="digits", choices=("digits", "mnist"))
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="benchmarks/results/rate_choice.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()}", flush=True)
    results = [
        run(args.problem, family, label, seed)
        for family in args.families
        for label in rows()
        for seed in args.seeds
    ]
    print("\n".join(table_lines(results)))
    write_json({"problem": args.problem, "results": results, "load": list(os.getloadavg())},
               args.out)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
