"""Why does Laplace's default call fall behind its grid at LeNet-5's ten-times budget?

    python benchmarks/laplace_prior.py                       # LeNet-5, 800 steps
    python benchmarks/laplace_prior.py --problem digits --budget 1

The fairness table (``benchmarks/fairness.py``) found the Laplace baseline's default call
0.11 nats behind the best of its grid at ``mnist x10``, the grid's best a rate of x 0.3. This
script fits the baseline's MAP point at the default call (its rate chosen by the range test)
and at each ``--scales`` of the grid's rates (``fairness.given_rate``), then builds
last-layer KFAC Laplace approximations at that same MAP point with the prior precision
fitted by the marginal likelihood (``zoo.laplace``'s default) and fixed at each of
``--precisions``. Each row: the MAP point's training and test NLL, the Laplace
approximation's test NLL and the prior precision it used. A fixed precision is scored on the
test set, so it shows the cause, not a recipe for choosing one. On the MNIST problems a
last row per MAP point chooses the precision on ``--validation`` held-out digits (training
digits after the 2,000 the fit sees; ``LaplaceOptions(prior_precision="gridsearch")``): the
recipe that needs no test set.

Results go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness  # noqa: E402
from saving import write_json  # noqa: E402

import zoo  # noqa: E402


def nll(posterior, x: torch.Tensor, y: torch.Tensor, samples: int) -> float:
    prediction = posterior.predict(x, num_samples=samples, seed=0, progress=False)
    return zoo.metrics.nll(prediction.probs, y)


def rows_at(problem: str, budget: int, scale, precisions, samples: int, data_root=None,
            validation=None):  # fmt: skip
    """One row per prior precision ("marglik" first, "gridsearch" last with ``validation``)
    at one MAP point."""
    start = time.perf_counter()
    model, fit, train, test = fairness.fit_once(problem, "map", budget, scale, data_root)
    point = {
        "rate": "default" if scale is None else f"x {scale:g}",
        "lr": fit.fitting()["lr"],
        "map_train_nll": nll(fit, *train, 1),
        "map_test_nll": nll(fit, *test, 1),
    }
    rows = []
    chosen = ("gridsearch",) if validation is not None else ()
    for precision in ("marglik", *precisions, *chosen):
        held_out = validation if precision == "gridsearch" else None
        la = zoo.laplace(model, train, at=fit, options={"prior_precision": precision},
                         validation=held_out, progress=False)  # fmt: skip
        rows.append(
            {
                **point,
                "prior": precision if isinstance(precision, str) else "fixed",
                "prior_precision": la.info["prior_precision"][0],
                "laplace_test_nll": nll(la, *test, samples),
                "laplace_seconds": la.wall_time,  # curvature and precision, not the MAP fit
            }
        )
    print(f"  {point['rate']}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return rows


def table_lines(rows: list[dict]) -> list[str]:
    lines = [
        "| MAP rate | lr | MAP train NLL | MAP test NLL | prior precision | Laplace test NLL "
        "| Laplace s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        how = {"marglik": " (marglik)", "gridsearch": " (held out)"}.get(r["prior"], "")
        precision = f"{r['prior_precision']:.3g}{how}"
        lines.append(
            f"| {r['rate']} | {r['lr']:.3g} | {r['map_train_nll']:.4f} | {r['map_test_nll']:.3f} "
            f"| {precision} | {r['laplace_test_nll']:.3f} | {r['laplace_seconds']:.1f} |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problem", default="mnist", choices=fairness.PROBLEMS)
    parser.add_argument("--budget", type=int, default=10, help="times the short budget")
    parser.add_argument("--scales", type=float, nargs="*", default=[0.3],
                        help="MAP rates beside the default call's, times the task's")  # fmt: skip
    parser.add_argument("--precisions", type=float, nargs="*", default=[1.0, 10.0, 100.0])
    parser.add_argument("--samples", type=int, default=100, help="draws per test prediction")
    parser.add_argument("--validation", type=int, default=None,
                        help="held-out digits for a gridsearch row (MNIST problems; default "
                        "1000 there, 0 elsewhere)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/laplace_prior.json")
    args = parser.parse_args(argv)
    if args.budget < 1 or args.samples < 1 or any(p <= 0 for p in args.precisions):
        parser.error("--budget and --samples must be at least 1, --precisions positive")
    mnist = args.problem in ("mnist", "resnet", *fairness.HELD_OUT)
    if args.validation is None:
        args.validation = 1000 if mnist else 0
    if args.validation < 0 or (args.validation and not mnist):
        parser.error("--validation takes a count >= 0 of held-out MNIST digits (MNIST problems)")
    torch.set_num_threads(args.threads)
    rows = []
    validation = fairness.validation_digits(args.problem, args.validation, args.data_root)
    for scale in (None, *args.scales):
        rows += rows_at(args.problem, args.budget, scale, args.precisions, args.samples,
                        args.data_root, validation)  # fmt: skip
    print("\n".join(table_lines(rows)))
    load = list(os.getloadavg())
    saved = {"problem": args.problem, "budget": args.budget, "validation": args.validation,
             "load": load, "rows": rows}  # fmt: skip
    write_json(saved, args.out)
    return rows


if __name__ == "__main__":
    main()
