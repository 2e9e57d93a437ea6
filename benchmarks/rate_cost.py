"""What the range test costs a short fit: each saved default call of ``benchmarks/fairness.py``
beside a fit given the rate that call chose, at the same seed (issue 69).

    python benchmarks/rate_cost.py --problem resnet --families mc_dropout diagonal

The default call sweeps (``zoo.training.rate``): its first steps run at rates from a tenth of
the task's rate up, the steps above the chosen rate are discarded, and the fit proper runs
what is left of the budget. A fit given the chosen rate (decaying tenfold, as the default
call's does) runs the whole budget at it. The difference of their test NLLs is the test's
cost where the rule chose well; the saved grid's best beside them says how far the rate was
from the best one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def given_rate(loaded: tuple, family: str, seed: int, lr: float) -> dict:
    """The test NLL of ``family`` on a problem (``fairness.problem``'s tuple, loaded once)
    fitted at ``lr`` (decaying tenfold)."""
    import zoo

    train, test, factory, options, _ = loaded
    start = time.perf_counter()
    table = zoo.compare(factory, [family], train, test, seed=seed, progress=False,
                        num_samples=100, lr=lr, optim={"lr_schedule": "exponential"},
                        **options)  # fmt: skip
    return {"nll": float(table.iloc[0]["nll"]), "seconds": time.perf_counter() - start}


def table_lines(rows: list[dict]) -> list[str]:
    """The README's table: per family and seed, the chosen rate, both NLLs and the cost."""
    lines = [
        "| family | seed | chosen lr | default call NLL | given that lr NLL | the test's cost |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cost = r["default_nll"] - r["given_nll"]
        lines.append(f"| {r['family']} | {r['seed']} | {r['lr']:.3g} | {r['default_nll']:.3f} | "
                     f"{r['given_nll']:.3f} | {cost:+.3f} |")  # fmt: skip
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default="resnet", help="a problem of fairness.py")
    parser.add_argument("--families", nargs="+", required=True)
    parser.add_argument("--data-root", help="MNIST's root (default: ZOO_DATA)")
    parser.add_argument("--saved", default="benchmarks/results/fairness.json")
    parser.add_argument("--out", default="benchmarks/results/rate_cost.json")
    args = parser.parse_args(argv)
    with open(args.saved) as f:
        saved = json.load(f)["results"]
    defaults = sorted(
        (r for r in saved if r["problem"] == args.problem and r["default"]
         and r["family"] in args.families),
        key=lambda r: (args.families.index(r["family"]), r.get("seed", 0)),
    )  # fmt: skip
    if not defaults:
        parser.error(f"no saved default call of {args.families} on {args.problem!r}")
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()}", flush=True)
    from fairness import problem

    loaded, rows = problem(args.problem, args.data_root), []
    for d in defaults:
        fit = given_rate(loaded, d["family"], d.get("seed", 0), d["lr_used"])
        rows.append({"family": d["family"], "seed": d.get("seed", 0), "lr": d["lr_used"],
                     "default_nll": d["nll"], "given_nll": fit["nll"],
                     "seconds": fit["seconds"]})  # fmt: skip
        print(table_lines(rows)[-1], flush=True)
    print("\n".join(table_lines(rows)))
    write_json({"problem": args.problem, "results": rows, "load": list(os.getloadavg())},
               args.out)  # fmt: skip


if __name__ == "__main__":
    main()
