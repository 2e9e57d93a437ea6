"""What a fit costs before its first useful step: a one-step ``zoo.fit`` in steady steps.

    python benchmarks/startup.py                 # both nets, the table in benchmarks/README.md
    python benchmarks/startup.py --net tiny --rounds 3

Per net, with ``zoo.fit``'s defaults (diagonal family, ``jit="auto"``, ``threads="auto"``) on
the CPU: the wall time of a one-step fit (guide set-up, checks, the FLOP count, the first step
and the check of its update), the median step of a long fit (``--long`` steps; the steps after
the first half, from a callback's timestamps) and their ratio, the start-up in steady steps
(target: at most 10). A 60-step fit is timed too, against 60 steady steps, and a long fit with
``jit=False``: its steady step, what the default fit's graph cost beyond it (zero where
``"auto"`` does not compile: the MLP on the CPU), and after how many steps the graph's saving
repays that: below it, ``jit=False`` is the faster choice for a short fit. Each figure is the
median over ``--rounds`` rounds, the nets alternating, after a warm-up round that is not counted
(a process's first fit also pays one-time imports and initialisation); note the machine's load
with them. Before each timed fit the garbage collector runs (untimed): a full collection in a
process that has imported torch and Pyro takes about 0.4 s on this machine whatever the fit
left, and where the interpreter happens to start one would otherwise decide a round.

Nets: ``tiny`` the 13-50-1 regression MLP on 256 examples (batch 32), ``mlp`` the
784-400-400-10 classifier on 1,024 random images (batch 128).

Then what a process pays before its first line of work (every Lightning rank, HMC
chain, command-line call and test worker pays it): fresh interpreters running ``import torch,
pyro``, ``import zoo`` and ``python -m zoo --help``, alternating, medians over ``--rounds``
(target: the zoo at most 1.3 times torch + pyro).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import suite
import torch

import zoo
from zoo.training.options import grouped

NETS = ("tiny", "mlp")


def problem(net: str):
    """``(model factory, data, batch size)`` of a net (seeded data)."""
    g = torch.Generator().manual_seed(0)
    if net == "tiny":
        x, y = torch.randn(256, 13, generator=g), torch.randn(256, generator=g)
        return lambda: zoo.models.BayesianMLP(13, (50,), 1, task="regression"), (x, y), 32
    x, y = torch.randn(1024, 784, generator=g), torch.randint(0, 10, (1024,), generator=g)
    return lambda: zoo.models.BayesianMLP(784, (400, 400), 10, task="classification"), (x, y), 128


def fit_time(net: str, steps: int, **options) -> tuple[float, list[float], str]:
    """Wall time of a ``steps``-step fit, the gaps between its steps' callbacks, and how its
    loss ran (``result.options["jit"]``)."""
    make, data, batch = problem(net)
    stamps: list[float] = []
    callbacks = [lambda state: stamps.append(time.perf_counter())] if steps > 1 else []
    gc.collect()  # the earlier fits' garbage is not this fit's start-up (see the docstring)
    start = time.perf_counter()
    fit = zoo.fit(make(), "diagonal", data, num_steps=steps, batch_size=batch, seed=0,
                  **grouped({"progress": False, "callbacks": callbacks, **options}))  # fmt: skip
    total = time.perf_counter() - start
    return total, [b - a for a, b in zip(stamps, stamps[1:])], fit.options["jit"]


def measure(net: str, long: int) -> dict[str, float]:
    """One round of a net's figures (seconds)."""
    one = fit_time(net, 1)[0]
    one_eager = fit_time(net, 1, jit=False)[0]
    short = fit_time(net, 60)[0]
    total, gaps, jit = fit_time(net, long)
    total_eager, gaps_eager, _ = fit_time(net, long, jit=False)
    steady = statistics.median(gaps[len(gaps) // 2 :])
    steady_eager = statistics.median(gaps_eager[len(gaps_eager) // 2 :])
    # What the long fit's graph cost beyond the eager fit, and the steps it takes to repay it
    # (nothing to repay where "auto" left the loss eager).
    compiled = jit == "compiled"
    compile_cost = total - total_eager + long * (steady_eager - steady) if compiled else 0.0
    saving = steady_eager - steady
    return {
        "compiled": float(compiled),
        "one": one,
        "one_eager": one_eager,
        "short": short,
        "steady": steady,
        "steady_eager": steady_eager,
        "compile": compile_cost,
        "break_even": compile_cost / saving if compiled and saving > 0 else float("nan"),
    }


#: What each process of the imports table runs: the libraries under the zoo, the zoo, its CLI.
IMPORTS = {
    "torch + pyro": ["-c", "import torch, pyro"],
    "zoo": ["-c", "import zoo"],
    "python -m zoo --help": ["-m", "zoo", "--help"],
}


def imports_table(rounds: int) -> dict[str, float]:
    """Median wall seconds of a fresh interpreter running each of :data:`IMPORTS`, the three
    alternating in every round (one warm-up round first: the disk cache), and each against
    ``torch + pyro``."""
    import subprocess
    import sys

    times: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for r in range(rounds + 1):
        for name, args in IMPORTS.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
            if r:
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(v) for name, v in times.items()}
    print("| process | wall s | / torch + pyro |\n| --- | ---: | ---: |")
    for name, value in medians.items():
        print(f"| {name} | {value:.2f} | {value / medians['torch + pyro']:.2f} |")
    return medians


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", nargs="+", default=list(NETS), choices=NETS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--long", type=int, default=400, help="steps of the long fit")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/startup.json")
    args = parser.parse_args(argv)
    with suite.record("startup", args.out, argv):
        rows = fits_table(args)
        print()
        imports_table(args.rounds)
    return rows


def fits_table(args) -> list[dict]:
    """The start-up table: per net, medians over ``args.rounds`` after a warm-up round."""
    rounds: dict[str, list[dict]] = {net: [] for net in args.net}
    for net in args.net:  # a warm-up round, not counted: the process's first fit of each net
        measure(net, 2)  # loads and initialises what every later fit finds ready
    for _ in range(args.rounds):
        for net in args.net:
            rounds[net].append(measure(net, args.long))
    rows = []
    print("| net | one-step fit ms | jit=False ms | steady step ms | start-up in steps "
          "| 60-step fit / 60 steady steps | eager step ms | graph ms "
          "| repaid after steps |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for net, values in rounds.items():
        row = {k: statistics.median(v[k] for v in values) for k in values[0]}
        row = {"net": net, **row, "ratio": row["one"] / row["steady"]}
        row["short_ratio"] = row["short"] / (60 * row["steady"])
        rows.append(row)
        graph = f"{row['compile'] * 1e3:.0f}" if row["compiled"] else "- (eager)"
        repaid = f"{row['break_even']:.0f}" if row["compiled"] else "-"
        print(
            f"| {net} | {row['one'] * 1e3:.1f} | {row['one_eager'] * 1e3:.1f} "
            f"| {row['steady'] * 1e3:.2f} | {row['ratio']:.1f} | {row['short_ratio']:.2f} "
            f"| {row['steady_eager'] * 1e3:.2f} | {graph} | {repaid} |"
        )
    return rows


if __name__ == "__main__":
    main()
