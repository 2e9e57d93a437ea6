"""The learning rate of a minibatch fit when the caller gives none: Adam at a constant 1e-3
against tenfold decays from 3e-3 and 1e-2 and each family's default call, on short and long
budgets (issue 60).

    python benchmarks/task_rate.py                       # every family, every budget
    python benchmarks/task_rate.py --budgets digits-10 --families whvi diagonal

``zoo.fit``'s default for data that is not small regression data (``zoo.training.recipes``)
must serve a fit of a hundred steps and one of thousands alike. Each family of
``guides.available()`` and MAP is fitted through ``zoo.compare`` with each rate on each budget
at the same seed and scored by test NLL per point and accuracy. Budgets (``fairness.py``'s
problems, and one of LeNet-5's first steps):

- ``templates-60``: 1,024 images of ten random templates plus unit noise, a LeNet-5 with 32
  hidden units, 60 steps at batch 64, tested on 1,000 more (data like the GPU tests');
- ``digits-10``: the 8x8 digits (1,438 train), 64-32-10 ReLU, 10 epochs at batch 128 (120 steps);
- ``digits-100``: the same for 100 epochs (1,200 steps);
- ``mnist-5``: 2,000 MNIST digits, LeNet-5, 5 epochs (80 steps), 2,000 test digits;
- ``mnist-full``: all 60,000 MNIST training digits, LeNet-5, one epoch (469 steps), 2,000 test
  digits (``--data-root`` or ``ZOO_DATA``).

Fits run in ``--processes`` worker processes of one thread each; ``--out`` keeps every fit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: The rates: the constant rate of earlier releases, tenfold decays from three and ten times it,
#: and the call with no rate (the family's recipe).
RATES = {
    "1e-3 constant": {"lr": 1e-3, "lr_schedule": None},
    "3e-3 decaying tenfold": {"lr": 3e-3, "lr_schedule": "exponential"},
    "1e-2 decaying tenfold": {"lr": 1e-2, "lr_schedule": "exponential"},
    "default": {"lr": None, "lr_schedule": None},  # zoo.fit's: 3e-3 x lr_scale, decaying
}
BUDGETS = {
    "templates-60": ("templates", 60),
    "digits-10": ("digits", 10),
    "digits-100": ("digits", 100),
    "mnist-5": ("mnist", 5),
    "mnist-full": ("mnist-full", 1),
}


def data(name: str, data_root: str | None):
    """``(train, test, model_factory)`` of a budget's problem."""
    from fairness import problem

    import zoo

    if name == "templates":
        return templates(1024, 0), templates(1000, 1), lambda: zoo.models.LeNet5(hidden=32)
    if name != "mnist-full":
        train, test, factory, _, _ = problem(name, data_root)
        return train, test, factory
    root = data_root or os.environ.get("ZOO_DATA")
    train_set = zoo.data.mnist(root, train=True, download=False)
    test_set = zoo.data.mnist(root, train=False, download=False, limit=2000)
    train = tuple(torch.stack(t) for t in zip(*train_set))
    return train, tuple(torch.stack(t) for t in zip(*test_set)), zoo.models.LeNet5


def templates(n: int, seed: int):
    """``n`` 28 x 28 images, each one of ten fixed random templates (one per class) plus unit
    noise drawn with ``seed``: separable, and learned by a LeNet-5 in a few dozen steps."""
    shapes = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1000 + seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return torch.randn(n, 1, 28, 28, generator=g) + shapes[y], y


def run_one(job: dict) -> dict:
    """Fit one family at one rate on one budget and score it (in a worker process)."""
    torch.set_num_threads(1)
    import zoo

    problem_name, epochs = BUDGETS[job["budget"]]
    train, test, factory = data(problem_name, job["data_root"])
    rate = RATES[job["rate"]]
    length = {"num_steps": epochs, "batch_size": 64} if problem_name == "templates" else {
        "epochs": epochs, "batch_size": 128}  # fmt: skip
    start = time.perf_counter()
    table = zoo.compare(
        factory,
        [job["family"]],
        train,
        test,
        **length,
        lr=rate["lr"],
        optim={"lr_schedule": rate["lr_schedule"]},
        seed=job["seed"],
        progress=False,
        num_samples=100,
    )
    row = table.iloc[0].to_dict()
    return {
        **{k: v for k, v in job.items() if k != "data_root"},
        "nll": float(row["nll"]),
        "accuracy": float(row["accuracy"]),
        "seconds": time.perf_counter() - start,
    }


def table_lines(results: list[dict]) -> list[str]:
    """A row per budget and family: each rate's test NLL (accuracy); the rates that ran."""
    rates = [r for r in RATES if any(x["rate"] == r for x in results)]
    lines = [
        "| budget | family | " + " | ".join(f"{r}: NLL (acc.)" for r in rates) + " |",
        "| --- | --- |" + " ---: |" * len(rates),
    ]
    keys = sorted({(r["budget"], r["family"]) for r in results},
                  key=lambda k: (list(BUDGETS).index(k[0]), k[1]))  # fmt: skip
    for budget, family in keys:
        cell = {r["rate"]: r for r in results if (r["budget"], r["family"]) == (budget, family)}
        shown = [
            f"{cell[r]['nll']:.3f} ({cell[r]['accuracy']:.3f})" if r in cell else "-" for r in rates
        ]
        lines.append(f"| {budget} | {family} | " + " | ".join(shown) + " |")
    return lines


def main(argv=None) -> list[dict]:
    import guides

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    parser.add_argument("--families", nargs="+", default=[*guides.available()])
    parser.add_argument("--rates", nargs="+", default=list(RATES), choices=list(RATES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--merge", help="a saved run whose fits this one adds to")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-root", help="MNIST's root (default: ZOO_DATA)")
    parser.add_argument("--out", help="a JSON file for every fit")
    args = parser.parse_args(argv)
    todo = [
        {"budget": b, "family": f, "rate": r, "seed": args.seed, "data_root": args.data_root}
        for b in args.budgets
        for f in args.families
        for r in args.rates
    ]
    print(f"{len(todo)} fits on {args.processes} processes; load {os.getloadavg()}", flush=True)
    results = []
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        for r in pool.imap_unordered(run_one, todo):
            results.append(r)
            print(f"  {r['budget']} {r['family']} {r['rate']}: NLL {r['nll']:.4f} "
                  f"acc {r['accuracy']:.3f} ({r['seconds']:.0f} s)", flush=True)  # fmt: skip
        pool.close()  # workers end on their own: terminate() would leave their semaphores
        pool.join()
    if args.merge:
        with open(args.merge) as f:
            results = json.load(f)["results"] + results
    print("\n".join(table_lines(results)))
    if args.out:
        write_json({"results": results, "load": list(os.getloadavg())}, args.out)
    return results


if __name__ == "__main__":
    main()
