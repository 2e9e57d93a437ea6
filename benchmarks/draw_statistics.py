"""Batch norm's statistics per draw against one shared set: the same posterior predicting both
ways, on the training and the test digits, every few epochs of a default call.

    python benchmarks/draw_statistics.py                      # ResNet-8 x 10, diagonal
    python benchmarks/draw_statistics.py --budget 1 --epochs 1 3 5

The default call (seed 0, the range test's rate) of ``--family`` on the ResNet-8 problem of
``fairness.problem`` at ``--budget`` times its short budget. At the end of each of ``--epochs``
(a callback) and at the fit's end, its posterior predicts ``--samples`` draws twice:

shared
    every draw reads the one set of running statistics (mid-fit: the steps' running averages;
    at the end: the refresh pass's, ``zoo.Run(statistics="refresh")``);
per draw
    each draw's own statistics on kept training inputs (``zoo.models.per_draw``): at
    the end the 512 digits the fit kept (the first of its refresh pass, a shuffled order);
    mid-fit, when a fit keeps none yet, the callback lends the model the first 512 training
    digits, so the two columns differ only in the statistics.

Each way is scored on the first ``--train`` training digits (the data the fit saw) and on the
test digits: if the shared statistics predict the *training* data badly too, the loss is not
overfitting but networks normalised with statistics that are not theirs. The end's predictions
are timed side by side (CPU seconds of this process per thread; the machine's load is saved).

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
from zoo.models.per_draw import kept_size  # noqa: E402


def scores(fit, x: torch.Tensor, y: torch.Tensor, samples: int) -> tuple[float, float, float]:
    """``(NLL, accuracy, CPU seconds per thread)`` of ``fit``'s predictive on ``(x, y)``."""
    start = time.process_time()
    prediction = fit.predict(x, num_samples=samples, seed=0, progress=False)
    seconds = (time.process_time() - start) / torch.get_num_threads()
    return zoo.metrics.nll(prediction.probs, y), zoo.metrics.accuracy(prediction.probs, y), seconds


def both_ways(fit, kept: torch.Tensor, train, test, samples: int) -> dict:
    """The shared and per-draw scores of ``fit``'s posterior, the model's own kept inputs (if
    any) back afterwards."""
    model = fit.model
    own = model.statistics_inputs
    out = {}
    try:
        for way, inputs in (("shared", None), ("per_draw", kept)):
            model.statistics_inputs = inputs
            nll, acc, _ = scores(fit, *train, samples)
            test_nll, test_acc, seconds = scores(fit, *test, samples)
            out[way] = {"train_nll": nll, "train_accuracy": acc, "test_nll": test_nll,
                        "test_accuracy": test_acc, "test_seconds": seconds}  # fmt: skip
    finally:
        model.statistics_inputs = own
    return out


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    loaded = fairness.problem("resnet", args.data_root, args.budget)
    train, test = loaded[0], loaded[1]
    seen = (train[0][: args.train], train[1][: args.train])
    kept = train[0][: kept_size(train[0])]
    rows = []

    def score(view) -> None:
        epoch = view.epoch + 1
        if view.epoch_end and epoch in args.epochs:
            rows.append({"epoch": epoch, **both_ways(view.result, kept, seen, test, args.samples)})
            print(f"  epoch {epoch}: {rows[-1]}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    _, fit, _, _ = fairness.fit_once("resnet", args.family, args.budget, None, args.data_root,
                                     {"callbacks": [score]}, loaded)  # fmt: skip
    assert fit.model.statistics_inputs is not None, "the default call keeps inputs"
    end = both_ways(fit, fit.model.statistics_inputs, seen, test, args.samples)
    rows.append({"epoch": "end", **end})
    return {"lr": fit.fitting()["lr"], "fit_seconds": time.perf_counter() - start, "rows": rows}


def table_lines(result: dict) -> list[str]:
    lines = [
        "| epoch | train NLL shared | train NLL per draw | test NLL shared | test NLL per draw "
        "| test accuracy shared | per draw |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        s, d = r["shared"], r["per_draw"]
        lines.append(
            f"| {r['epoch']} | {s['train_nll']:.3f} | {d['train_nll']:.3f} | {s['test_nll']:.3f} "
            f"| {d['test_nll']:.3f} | {s['test_accuracy']:.3f} | {d['test_accuracy']:.3f} |"
        )
    end = result["rows"][-1]
    ratio = end["per_draw"]["test_seconds"] / end["shared"]["test_seconds"]
    lines.append(f"\nprediction time per draw / shared (test digits, the end): {ratio:.2f}")
    return lines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=10, help="times the short budget")
    parser.add_argument("--family", default="diagonal")
    parser.add_argument("--epochs", type=int, nargs="*", default=[2, 6, 14, 30])
    parser.add_argument("--samples", type=int, default=20, help="draws per prediction")
    parser.add_argument("--train", type=int, default=1000, help="training digits scored")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/draw_statistics.json")
    args = parser.parse_args(argv)
    if (
        min(args.budget, args.samples, args.train, args.threads) < 1
        or min(args.epochs, default=1) < 1
    ):
        parser.error("--budget, --samples, --train, --threads and --epochs must be at least 1")
    result = run(args)
    print("\n".join(table_lines(result)))
    saved = {
        k: getattr(args, k) for k in ("budget", "family", "epochs", "samples", "train", "threads")
    }
    write_json({**saved, "load": list(os.getloadavg()), **result}, args.out)
    return result


if __name__ == "__main__":
    main()
