"""How many kept inputs each draw's batch norm statistics need: one posterior predicting with
each draw's statistics estimated on the first ``K`` inputs its fit kept, ``K`` side by side.

    python benchmarks/kept_inputs.py                          # ResNet-8 x 10, diagonal
    python benchmarks/kept_inputs.py --budget 1 --kept 32 128 512

The default call (seed 0, the range test's rate) of ``--family`` on the ResNet-8 problem of
``fairness.problem`` at ``--budget`` times its short budget keeps
``zoo.models.per_draw.KEPT_INPUTS`` (512) training inputs. Its posterior then predicts the
test digits with ``--samples`` draws (seed 0: the same draws in every row), first with the one
shared set of running statistics (``zoo.Run(statistics="refresh")``'s), then with each draw's
own statistics on the first ``K`` kept inputs for each ``K`` of ``--kept``. Columns: the test
NLL and accuracy, and the prediction's CPU seconds per thread beside the shared set's,
measured side by side in one process (the machine's load is saved).

Results go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import draw_statistics  # noqa: E402
import fairness  # noqa: E402
from saving import write_json  # noqa: E402

from zoo.models.per_draw import KEPT_INPUTS  # noqa: E402


def run(args) -> dict:
    """The fit, then one prediction of the test digits per row; the model's kept inputs are
    back as the fit left them afterwards."""
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    _, fit, _, test = fairness.fit_once("resnet", args.family, args.budget, None, args.data_root)
    fit_seconds = time.perf_counter() - start
    kept = fit.model.statistics_inputs
    assert kept is not None, "the default call keeps inputs for each draw's statistics"
    rows = []
    try:
        for size in (None, *args.kept):
            fit.model.statistics_inputs = None if size is None else kept[:size]
            nll, accuracy, seconds = draw_statistics.scores(fit, *test, args.samples)
            rows.append({"kept": size, "test_nll": nll, "test_accuracy": accuracy,
                         "test_seconds": seconds})  # fmt: skip
            print(f"  {size or 'shared'}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        fit.model.statistics_inputs = kept
    return {"lr": fit.fitting()["lr"], "fit_seconds": fit_seconds, "kept_by_fit": len(kept),
            "rows": rows}  # fmt: skip


def table_lines(result: dict) -> list[str]:
    """The rows as a Markdown table, the shared set first."""
    shared = result["rows"][0]["test_seconds"]
    lines = [
        "| statistics | test NLL | test accuracy | CPU s per thread | x shared |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        label = "one shared set" if r["kept"] is None else f"per draw, {r['kept']} kept inputs"
        lines.append(
            f"| {label} | {r['test_nll']:.3f} | {r['test_accuracy']:.3f} "
            f"| {r['test_seconds']:.1f} | {r['test_seconds'] / shared:.2f} |"
        )
    return lines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=10, help="times the short budget")
    parser.add_argument("--family", default="diagonal")
    parser.add_argument("--kept", type=int, nargs="+", default=[64, 128, 256, 512],
                        help=f"kept inputs per row, 1 to {KEPT_INPUTS}")  # fmt: skip
    parser.add_argument("--samples", type=int, default=20, help="draws per prediction")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/kept_inputs.json")
    args = parser.parse_args(argv)
    if min(args.budget, args.samples, args.threads) < 1:
        parser.error("--budget, --samples and --threads must be at least 1")
    if not all(1 <= k <= KEPT_INPUTS for k in args.kept):
        parser.error(f"--kept takes counts from 1 to {KEPT_INPUTS}, what a fit keeps at most")
    result = run(args)
    print("\n".join(table_lines(result)))
    saved = {k: getattr(args, k) for k in ("budget", "family", "kept", "samples", "threads")}
    write_json({**saved, "load": list(os.getloadavg()), **result}, args.out)
    return result


if __name__ == "__main__":
    main()
