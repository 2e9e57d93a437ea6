"""Which rule should read the range test's sweep? Rules side by side on recorded sweeps (issue 69).

    python benchmarks/rate_rules.py record --problems digits mnist resnet   # the sweeps
    python benchmarks/rate_rules.py score                                  # the table
    python benchmarks/rate_rules.py against --sweeps FILE   # this machine's rates, the table's

``record`` runs the default call of each family of ``benchmarks/fairness.py``'s problems at
each seed and keeps its range test's sweep (``result.options["lr_test"]``: rates and data
terms), stopping the fit when the sweep is over: the sweep is what a rule reads, the rest of the
fit is not needed. ``score`` applies each rule to every recorded sweep and reads the test NLL
at the rate it chooses off the family's grid in ``benchmarks/results/fairness.json`` (seed 0,
the default initial scale; piecewise linear in the log of the rate, the grid's end value
beyond it), less the grid's best: the gap each rule would leave, were the fit proper at its
rate all that changed. The rules: the rate at the smoothed minimum over ``d`` for several
``d`` (each capped at ten times the steepest fall's rate; ``min/4`` was ``zoo.training.rate``'s
rule before the held-out check below),
the steepest fall's rate, their geometric mean, fastai's ``valley`` (about halfway along
the longest falling run of the smoothed curve: its ``lr_find`` suggestion) and multiples of
it, and two combinations of ``min/4`` and the valley, the lower of ``min/4`` and four times
the valley being ``zoo.training.rate_rule.choose``'s rule (read from it).

``against`` lists the sweeps of ``--sweeps`` whose chosen rate differs from the one the default
call of the same problem, family and seed chose in ``--grids``' saved results, and counts those
that agree: whether a machine recording the sweeps again chooses the table's rates (the same
code and seed can sum in another order on another CPU, and a sweep at rising rates can
amplify it).

Rules read off the table's sweeps are tested on problems they were not chosen on:
``--problems mlp cnn`` (``fairness.HELD_OUT``) with their own grids and sweeps
(``fairness.py --problems mlp cnn ... --out benchmarks/results/rate_held_out.json``, then
``record ... --sweeps benchmarks/results/rate_sweeps_held_out.json`` and ``score`` with both
files).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FAMILIES = ("block_diagonal", "diagonal", "lowrank", "map", "matrix_normal", "mc_dropout",
            "subnetwork", "tridiagonal", "whvi")  # fmt: skip
DIVISORS = (2, 3, 4, 6, 8, 12)
VALLEY_FACTORS = (2, 3)


class _SweepOver(Exception):
    """Raised once the sweep is recorded: the fit proper is not run."""


def record(problems, families, seeds, data_root=None) -> list[dict]:
    """The sweep of each default call (its ``lr_test`` record), the fit stopped after it."""
    from fairness import problem

    import zoo
    from zoo.training import rate

    real, seen = rate.measure, {}

    def keep(*args, **kwargs):
        measured = real(*args, **kwargs)
        seen["record"] = None if measured is None else measured.record
        raise _SweepOver

    out = []
    rate.measure = keep  # the one hook: the sweep's record, where the fit reads it
    try:
        for name in problems:
            base, _, times = name.partition(" x")
            train, _, factory, options, _ = problem(base, data_root, int(times or 1))
            for family in families:
                for seed in seeds:
                    seen.clear()
                    try:
                        zoo.fit(factory(), family, train, seed=seed,
                                run=zoo.Run(progress=False), **options)  # fmt: skip
                    except _SweepOver:
                        pass
                    if seen.get("record"):
                        out.append({"problem": name, "family": family, "seed": seed,
                                    **seen["record"]})  # fmt: skip
                        print(f"  {name} {family} {seed}: lr {out[-1]['lr']:.3g}", flush=True)
    finally:
        rate.measure = real
    return out


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` sweeps with ``new`` ones in place of those of the same problem, family and seed
    (in ``old``'s order; new ones without a match at the end)."""

    def key(s):
        return s["problem"], s["family"], s["seed"]

    fresh = {key(s): s for s in new}
    out = [fresh.pop(key(s), s) for s in old]
    return out + list(fresh.values())


def rules() -> dict:
    """``{label: sweep record -> rate}``."""
    from zoo.training.rate_rule import STEEP_FACTOR, choose, landmarks

    def by_minimum(rec, d):
        rates, marks = rec["rates"], landmarks(rec["data_losses"])
        if marks.best == 0:
            return rec["base"]
        return max(min(rates[marks.best] / d, rates[marks.steep] * STEEP_FACTOR), rates[0])

    def steepest(rec):
        return rec["rates"][landmarks(rec["data_losses"]).steep]

    def valley(rec):  # fastai's lr_find suggestion, on the smoothed data term
        return rec["rates"][landmarks(rec["data_losses"]).valley]

    out = {f"min/{d}": (lambda rec, d=d: by_minimum(rec, d)) for d in DIVISORS}
    out["steepest"] = steepest
    out["geometric mean of steepest and min/4"] = lambda rec: math.sqrt(
        steepest(rec) * by_minimum(rec, 4)
    )
    out["valley (fastai)"] = valley
    for k in VALLEY_FACTORS:
        out[f"valley x {k}"] = lambda rec, k=k: valley(rec) * k
    # the two read together, each guarding the other's failure (min/4 overshoots where batch
    # norm stretches the sweep, valley x 3 undershoots the digits' structured families)
    out["lower of min/4 and valley x 4 (zoo's)"] = lambda rec: (
        choose(rec["rates"], rec["data_losses"])[1] or rec["base"]
    )
    out["geometric mean of min/4 and valley x 3"] = lambda rec: math.sqrt(
        by_minimum(rec, 4) * 3 * valley(rec)
    )
    return out


def grids(results: list[dict]) -> dict:
    """``{(problem, family): {rate: NLL}}`` of the saved grids (seed 0, initial scale x 1)."""
    out: dict = collections.defaultdict(dict)
    for r in results:
        if not r["default"] and r.get("seed", 0) == 0 and r["init"] == 1.0:
            if math.isfinite(r["nll"]):
                out[(r["problem"], r["family"])][r["lr_used"]] = r["nll"]
    return out


def read_off(curve: dict, lr: float) -> float:
    """The NLL at ``lr`` on ``curve``: piecewise linear in ``log lr``, flat beyond its ends."""
    points = sorted((math.log(k), v) for k, v in curve.items())
    x = math.log(lr)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[-1][1]


def score(sweeps: list[dict], results: list[dict]) -> list[str]:
    """The table: per rule, the mean gap per problem and overall, and the sweeps over 0.05."""
    curves = grids(results)
    usable = [s for s in sweeps if len(curves.get((s["problem"], s["family"]), {})) >= 3]
    problems = list(dict.fromkeys(s["problem"] for s in usable))
    lines = [
        "| rule | " + " | ".join(problems) + " | all | sweeps over 0.05 |",
        "| --- |" + " ---: |" * (len(problems) + 2),
    ]
    for label, rule in rules().items():
        gaps = collections.defaultdict(list)
        for s in usable:
            curve = curves[(s["problem"], s["family"])]
            gaps[s["problem"]].append(read_off(curve, rule(s)) - min(curve.values()))
        every = [g for p in problems for g in gaps[p]]
        cells = [f"{sum(gaps[p]) / len(gaps[p]):.3f}" for p in problems]
        over = sum(g > 0.05 for g in every)
        lines.append(f"| {label} | " + " | ".join(cells) +
                     f" | {sum(every) / len(every):.3f} | {over} of {len(every)} |")  # fmt: skip
    return lines


def against(sweeps: list[dict], results: list[dict]) -> list[str]:
    """The rates each sweep chose that differ by more than 0.1% from the saved default call's
    of the same problem, family and seed (sweeps without one left out), with the ratio, and
    how many agree."""
    saved = {(r["problem"], r["family"], r.get("seed", 0)): r["lr_used"]
             for r in results if r["default"]}  # fmt: skip
    lines = [
        "| problem | family | seed | rate recorded | rate saved | ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    ratios = []
    for s in sweeps:
        there = saved.get((s["problem"], s["family"], s["seed"]))
        if there is None:
            continue
        ratios.append(s["lr"] / there)
        if abs(ratios[-1] - 1) >= 1e-3:
            lines.append(f"| {s['problem']} | {s['family']} | {s['seed']} | {s['lr']:.3g} "
                         f"| {there:.3g} | {ratios[-1]:.2f} |")  # fmt: skip
    same = sum(abs(r - 1) < 1e-3 for r in ratios)
    lines.append(f"\n{same} of {len(ratios)} rates as saved")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "score", "against"))
    parser.add_argument(
        "--problems",
        nargs="+",
        default=["digits", "mnist", "resnet"],
        help="fairness.py's problems; 'digits x10' for ten times the budget",
    )
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data-root", help="MNIST's root (default: ZOO_DATA)")
    parser.add_argument("--sweeps", default="benchmarks/results/rate_sweeps.json")
    parser.add_argument("--grids", default="benchmarks/results/fairness.json")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="record: put this run's sweeps in place of --sweeps' of the same problem, family "
        "and seed, keeping the others (a family whose fits changed, recorded again)",
    )
    args = parser.parse_args(argv)
    if args.merge and (args.action != "record" or not os.path.exists(args.sweeps)):
        parser.error(
            f"--merge puts the recorded sweeps into an existing --sweeps file ({args.sweeps}): "
            "use it with record and a file that exists, or leave it out to write a new one"
        )
    if args.action == "record":
        torch.set_num_threads(1)
        print(f"load {os.getloadavg()}", flush=True)
        sweeps = record(args.problems, args.families, args.seeds, args.data_root)
        if args.merge:
            with open(args.sweeps) as f:
                old = json.load(f)["sweeps"]
            sweeps = merged(old, sweeps)
        write_json({"sweeps": sweeps, "load": list(os.getloadavg())}, args.sweeps, indent=None)
        return
    with open(args.sweeps) as f:
        sweeps = json.load(f)["sweeps"]
    with open(args.grids) as f:
        results = json.load(f)["results"]
    print("\n".join((score if args.action == "score" else against)(sweeps, results)))


if __name__ == "__main__":
    main()
