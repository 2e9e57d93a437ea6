"""Does a better ELBO give a better test NLL? One family's fit on a fairness problem at its
default call and at given rates, the objective beside the predictions.

    python benchmarks/elbo_against_nll.py                     # ResNet-8 x 10, diagonal
    python benchmarks/elbo_against_nll.py --problem digits --budget 1 --scales 0.3

``benchmarks/fairness.py`` found the diagonal family's default call on the ResNet-8 at ten
times its budget far behind its grid's best, the grid's lowest rate. Each row here is one fit
(seed 0) of ``--family`` on ``--problem`` (``fairness.problem``: the same data, network and
budget): the default call (the range test's rate), then each ``--scales`` of the grid's
rates (``fairness.given_rate``: the task's rate times the family's scale). Columns: the rate,
the ``-ELBO`` (full-data scale, ``zoo.inference.elbo``) averaged over the first and the last
epoch, and the training (its first 1,000 examples) and test accuracy and NLL per point of
the posterior predictive.

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


def scores(fit, x: torch.Tensor, y: torch.Tensor, samples: int) -> tuple[float, float]:
    """Accuracy and NLL per point of ``fit``'s predictive on ``(x, y)``."""
    prediction = fit.predict(x, num_samples=samples, seed=0, progress=False)
    return zoo.metrics.accuracy(prediction.probs, y), zoo.metrics.nll(prediction.probs, y)


def row(problem: str, budget: int, family: str, scale: float | None, samples: int, root=None):
    """One fit at the default call (``scale=None``) or at the grid's rate ``scale``."""
    start = time.perf_counter()
    # the model's ELBO from the family's own start (no MAP phase: zoo.training.map_start)
    _, fit, train, test = fairness.fit_once(problem, family, budget, scale, root,
                                            {"map_start": False})  # fmt: skip
    train_acc, train_nll = scores(fit, train[0][:1000], train[1][:1000], samples)
    test_acc, test_nll = scores(fit, *test, samples)
    epochs = fit.epoch_losses or fit.losses
    print(f"  {scale or 'default'}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return {
        "rate": "default" if scale is None else f"x {scale:g}",
        "lr": fit.fitting()["lr"],
        "lr_rule": fit.fitting()["lr_rule"],
        "first_epoch_loss": epochs[0],
        "last_epoch_loss": epochs[-1],
        "train_accuracy": train_acc,
        "train_nll": train_nll,
        "test_accuracy": test_acc,
        "test_nll": test_nll,
    }


def table_lines(rows: list[dict], family: str | None = None) -> list[str]:
    """The rows as a Markdown table; with ``family``, a first column names it (so that the
    tables of several families' runs stack into one)."""
    lead, rule = ("| family ", "| --- ") if family else ("", "")
    lines = [
        f"{lead}| rate | lr | -ELBO, first epoch | -ELBO, last epoch | train accuracy / NLL "
        "| test accuracy / NLL |",
        f"{rule}| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            (f"| {family} " if family else "")
            + f"| {r['rate']} | {r['lr']:.3g} | {r['first_epoch_loss']:,.0f} "
            f"| {r['last_epoch_loss']:,.0f} | {r['train_accuracy']:.3f} / {r['train_nll']:.3f} "
            f"| {r['test_accuracy']:.3f} / {r['test_nll']:.3f} |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problem", default="resnet", choices=fairness.PROBLEMS)
    parser.add_argument("--budget", type=int, default=10, help="times the short budget")
    parser.add_argument("--family", default="diagonal")
    parser.add_argument("--scales", type=float, nargs="*", default=[0.3],
                        help="given rates beside the default call's, times the task's")  # fmt: skip
    parser.add_argument("--samples", type=int, default=20, help="draws per prediction")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/elbo_against_nll.json")
    args = parser.parse_args(argv)
    if args.budget < 1 or args.samples < 1 or any(s <= 0 for s in args.scales):
        parser.error("--budget and --samples must be at least 1, --scales positive")
    torch.set_num_threads(args.threads)
    rows = [
        row(args.problem, args.budget, args.family, scale, args.samples, args.data_root)
        for scale in (None, *args.scales)
    ]
    print("\n".join(table_lines(rows, args.family)))
    saved = {"problem": args.problem, "budget": args.budget, "family": args.family,
             "load": list(os.getloadavg()), "rows": rows}  # fmt: skip
    write_json(saved, args.out)
    return rows


if __name__ == "__main__":
    main()
