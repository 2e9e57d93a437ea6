"""What would meet the target where the ELBO's optimum predicts badly? A fit's held-out NLL
every few epochs, at the default call with the KL weighted as given.

    python benchmarks/held_out_curve.py                       # ResNet-8 x 10, diagonal
    python benchmarks/held_out_curve.py --families diagonal lowrank --kl-weights 1 0.1
    python benchmarks/held_out_curve.py --problem mnist --budget 1 --kl-weights 1

``benchmarks/elbo_against_nll.py`` found the diagonal family's default call on the ResNet-8 at
ten times its budget near chance, read then as the KL of its 74,522 weights outweighing 2,000
digits. Most of that was batch norm: every draw read one shared set of statistics
(``benchmarks/draw_statistics.py``; each draw's own are the default since). The curves here
study two ways out that change what a fit does, not its rate: stopping on held-out data, or a
tempered objective (``zoo.Loss(kl_weight=...)``, the KL's factor). Each row is the default call
(seed 0; the range test's rate) of one of ``--families`` on ``--problem``
(``fairness.problem``) with one of ``--kl-weights``; a callback scores the fit's predictive
(``--samples`` draws) at the end of every ``--every``-th epoch, and the fit is scored again at
its end, on ``--validation`` held-out training digits (the ones after the fit's 2,000) and on
the test digits. Early stopping would keep the scored point of the lowest held-out NLL (the
fit's end among them): the row gives its epoch and its test NLL beside the fit's final test
NLL.

A fit keeps the inputs of each draw's own batch-norm statistics only at its end
(``zoo.models.per_draw``), so a mid-fit score lends the model the first
``zoo.models.per_draw.KEPT_INPUTS`` training inputs (in the data's order; a fit keeps its
shuffled first pass's) for its prediction and puts back what it held before the next step
(``--mid-fit-statistics per_draw``, the default: what every prediction after a default fit
reads); ``running`` reads the steps' running averages, one shared set for every draw, as this
script's first run did. (A default fit now holds a random sample of the training inputs
itself while it fits, ``zoo.training.refresh.hold_inputs``; the lent ones keep the saved runs'
scores.) The end's score is after the fit's refresh pass, each draw with its
own statistics on the inputs the fit kept. One fit per process, ``--processes`` at a time.

Results go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness  # noqa: E402
from saving import write_json  # noqa: E402

import zoo  # noqa: E402


def nll(fit, x: torch.Tensor, y: torch.Tensor, samples: int) -> float:
    prediction = fit.predict(x, num_samples=samples, seed=0, progress=False)
    return zoo.metrics.nll(prediction.probs, y)


@contextlib.contextmanager
def lent_inputs(model, inputs: torch.Tensor | None):
    """``model`` predicts with each draw's own batch-norm statistics on ``inputs`` inside the
    block (``None``: as it is) and holds what it held after it (the fit's own sample, under
    ``statistics="per_draw"``); a model without running statistics is left alone."""
    if inputs is None or not getattr(model, "_statistics", ()):
        yield
        return
    held = model.statistics_inputs
    setattr(model, "statistics_inputs", inputs)  # noqa: B010 - a zoo model's buffer
    try:
        yield
    finally:
        setattr(model, "statistics_inputs", held)  # noqa: B010


def curve(job: dict) -> dict:
    """One default call with the KL weight ``job["kl_weight"]``, scored at the end of every
    ``job["every"]``-th epoch and at the fit's end (after its refresh pass)."""
    torch.set_num_threads(job["threads"])
    start = time.perf_counter()
    held_out = fairness.validation_digits(job["problem"], job["validation"], job["data_root"])
    loaded = fairness.problem(job["problem"], job["data_root"], job["budget"])
    test = loaded[1]
    samples, every, scored, begun = job["samples"], job["every"], [], [0]
    lent = None
    if job["mid_fit_statistics"] == "per_draw":
        from zoo.models.per_draw import KEPT_INPUTS

        lent = loaded[0][0][:KEPT_INPUTS]

    def score(view) -> None:
        begun[0] = view.epoch + 1  # the epochs begun (view.epoch counts from 0)
        if view.epoch_end and begun[0] % every == 0:
            with lent_inputs(view.result.model, lent):
                held = nll(view.result, *held_out, samples)
                tested = nll(view.result, *test, samples)
            scored.append((begun[0], held, tested))

    # the family's ELBO from its own start, epoch by epoch (no MAP phase: zoo.training.map_start)
    extra = {"kl_weight": job["kl_weight"], "callbacks": [score], "map_start": False}
    _, fit, _, _ = fairness.fit_once(job["problem"], job["family"], job["budget"], None,
                                     job["data_root"], extra, loaded)  # fmt: skip
    end = (begun[0], nll(fit, *held_out, samples), nll(fit, *test, samples))
    best = min([*scored, end], key=lambda point: point[1])
    print(f"  kl_weight {job['kl_weight']:g}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return {
        "family": job["family"],
        "kl_weight": job["kl_weight"],
        "lr": fit.fitting()["lr"],
        "epochs": begun[0],  # the range test's steps are the budget's: the last may be partial
        "scored_epochs": [e for e, _, _ in scored],
        "held_out_nll": [h for _, h, _ in scored],
        "test_nll": [t for _, _, t in scored],
        "final_held_out_nll": end[1],
        "final_test_nll": end[2],
        "best_epoch": best[0],
        "best_held_out_nll": best[1],
        "test_nll_at_best": best[2],
        "seconds": time.perf_counter() - start,
    }


def table_lines(rows: list[dict]) -> list[str]:
    lines = [
        "| family | KL weight | lr | epochs | final test NLL | lowest held-out NLL (epoch) "
        "| test NLL there |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['kl_weight']:g} | {r['lr']:.3g} | {r['epochs']} "
            f"| {r['final_test_nll']:.3f} | {r['best_held_out_nll']:.3f} ({r['best_epoch']}) "
            f"| {r['test_nll_at_best']:.3f} |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problem", default="resnet", choices=("mnist", "resnet"))
    parser.add_argument("--budget", type=int, default=10, help="times the short budget")
    parser.add_argument("--families", nargs="+", default=["diagonal"])
    parser.add_argument("--kl-weights", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--samples", type=int, default=10, help="draws per prediction")
    parser.add_argument("--every", type=int, default=2, help="epochs between scores")
    parser.add_argument("--validation", type=int, default=1000, help="held-out digits")
    parser.add_argument("--mid-fit-statistics", default="per_draw", choices=("per_draw", "running"),
                        help="batch norm's statistics of the mid-fit scores")  # fmt: skip
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/held_out_curve.json")
    args = parser.parse_args(argv)
    counts = (args.budget, args.samples, args.every, args.validation, args.processes,
              args.threads)  # fmt: skip
    if min(counts) < 1 or any(w <= 0 for w in args.kl_weights):
        parser.error(
            "--budget, --samples, --every, --validation, --processes and --threads must be at "
            "least 1, --kl-weights positive"
        )
    known = fairness.variational()
    unknown = [f for f in args.families if f not in known]
    if unknown:
        parser.error(f"unknown --families {unknown}: the variational families are {known}")
    jobs = [
        {**vars(args), "family": f, "kl_weight": w, "families": None, "kl_weights": None}
        for f in args.families
        for w in args.kl_weights
    ]  # one fit each
    with multiprocessing.get_context("spawn").Pool(min(args.processes, len(jobs))) as pool:
        rows = pool.map(curve, jobs)
        pool.close()  # workers end on their own: terminate() would leave their semaphores
        pool.join()
    print("\n".join(table_lines(rows)))
    load = list(os.getloadavg())
    kept = ("problem", "budget", "families", "validation", "samples", "every",
            "mid_fit_statistics")  # fmt: skip
    saved = {key: getattr(args, key) for key in kept}
    write_json({**saved, "load": load, "rows": rows}, args.out)
    return rows


if __name__ == "__main__":
    main()
