"""What the rate test costs in CPU time: a default call (which sweeps for its rate) against the
same fit given the rate that call chose (issue 96, target: within 1.03x).

    python benchmarks/rate_test.py                        # the three networks, both families
    python benchmarks/rate_test.py --nets digits --rounds 3

Per network and family, the default call (``zoo.fit`` given no ``lr``: its range test,
``zoo.training.rate``, charged to its budget) and a fit given the rate that call chose
(decaying tenfold, as the default call's does), the same seed, budget and minibatches. Each fit
runs in a fresh process of one torch thread and is timed by that process's CPU time around
``zoo.fit`` (the interpreter's start-up and imports left out); the two alternate, and each
figure is the median over ``--rounds``. The ratio is the default call's CPU time over the
given-rate fit's. Two fits' CPU times differ by a few percent on a shared machine, more than
the test costs, so the default call also reads its own: the sweep's wall time beyond as many
of the fit's steady steps (the median step of its fit proper, from a callback's timestamps),
in steady steps and as the ratio it makes to the fit's wall time (an upper bound where the
loss is compiled: the sweep's first step builds the graph, which the given-rate fit builds
in its first step). Families: ``map`` (the point estimate's default call, whose sweep is
also the MAP phase of every family's fit from scratch) and ``diagonal`` with
``map_start=False`` (the family's own sweep on its ELBO). Networks: ``digits``
(scikit-learn's 8x8 digits, the 64-32-10 MLP, 10 epochs), ``lenet`` (LeNet-5 on 10,000
MNIST digits, 3 epochs of 128), ``resnet`` (ResNet-8 on 2,000 MNIST digits, 5 epochs of
128). The machine's load is printed and saved.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from saving import write_json  # noqa: E402

NETS = ("digits", "lenet", "resnet")
FAMILIES = ("map", "diagonal")
TARGET = 1.03


def problem(net: str, root: str | None):
    """``(train, model_factory, fit_options)`` of a network."""
    import fairness

    import zoo

    if net == "digits":
        train, _, factory, options, _ = fairness.problem("digits", root)
        return train, factory, options
    if net == "resnet":
        train, _, factory, options, _ = fairness.problem("resnet", root)
        return train, factory, options
    data = zoo.data.mnist(root, train=True, download=False, limit=10_000)
    train = tuple(torch.stack(t) for t in zip(*data))
    return train, zoo.models.LeNet5, {"epochs": 3, "batch_size": 128}


def timed_fit(job: dict) -> dict:
    """One fit of ``job`` in this (fresh) process: its CPU seconds, the rate it ran at."""
    import zoo

    torch.set_num_threads(1)
    train, factory, options = problem(job["net"], job["root"])
    loss = {"map_start": False} if job["family"] != "map" else {}
    given = {} if job["lr"] is None else {"lr": job["lr"], "optim": {"lr_schedule": "exponential"}}
    torch.manual_seed(0)
    model = factory()
    stamps: list[float] = []
    run = {"progress": False, "callbacks": [lambda view: stamps.append(time.perf_counter())]}
    start, wall = time.process_time(), time.perf_counter()
    fit = zoo.fit(model, job["family"], train, seed=0, loss=loss, run=run, **options, **given)
    seconds, wall = time.process_time() - start, time.perf_counter() - wall
    test = fit.options.get("lr_test") or {}
    step = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    return {"seconds": seconds, "lr": fit.options["lr"], "steps": fit.options["num_steps"],
            "sweep": test.get("steps", 0), "wall": wall, "steady_step": step,
            "sweep_seconds": test.get("seconds", 0.0)}  # fmt: skip


def run(jobs: list[dict]) -> list[dict]:
    """Each job in its own spawned process, one at a time."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1, maxtasksperchild=1) as pool:
        rows = pool.map(timed_fit, jobs, chunksize=1)
        pool.close()  # workers end on their own: terminate() would leave their semaphores
        pool.join()
    return rows


def measure(net: str, family: str, rounds: int, root: str | None) -> dict:
    """The median CPU seconds of the default call and of the fit given its chosen rate."""
    default, given, excess, lr, sweep = [], [], [], None, 0
    for _ in range(rounds):
        first = run([{"net": net, "family": family, "lr": None, "root": root}])[0]
        lr, sweep = first["lr"], first["sweep"]
        second = run([{"net": net, "family": family, "lr": lr, "root": root}])[0]
        default.append(first["seconds"])
        given.append(second["seconds"])
        # the sweep's seconds beyond as many of the fit's steady steps, a share of its wall time
        extra = first["sweep_seconds"] - sweep * first["steady_step"]
        excess.append((extra / first["steady_step"], 1 + extra / first["wall"]))
    d, g = statistics.median(default), statistics.median(given)
    return {"net": net, "family": family, "lr": lr, "sweep_steps": sweep,
            "steps": first["steps"] + sweep, "default_seconds": d, "given_seconds": g,
            "ratio": d / g, "sweep_excess_steps": statistics.median(e[0] for e in excess),
            "estimated_ratio": statistics.median(e[1] for e in excess)}  # fmt: skip


def table_lines(rows: list[dict]) -> list[str]:
    """The table: per network and family, both CPU times, their ratio and the target."""
    lines = [
        "| network | family | steps (sweep) | default call, s | given its rate, s | ratio | "
        "sweep's excess, steady steps | ratio from it | target |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['net']} | {r['family']} | {r['steps']} ({r['sweep_steps']}) | "
            f"{r['default_seconds']:.2f} | {r['given_seconds']:.2f} | {r['ratio']:.3f}x | "
            f"{r['sweep_excess_steps']:.1f} | {r['estimated_ratio']:.3f}x | {TARGET:.2f}x |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=NETS)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA"))
    parser.add_argument("--out", default="benchmarks/results/rate_test.json")
    args = parser.parse_args(argv)
    load = list(os.getloadavg())
    rows = [measure(n, f, args.rounds, args.data_root) for n in args.nets for f in args.families]
    print(f"load before: {load}, after: {list(os.getloadavg())}")
    print("\n".join(table_lines(rows)))
    command = "python benchmarks/rate_test.py " + " ".join(argv or sys.argv[1:])
    write_json({"command": command, "load": [load, list(os.getloadavg())], "rows": rows},
               args.out)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
