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

``--last-batch``: one-epoch fits of the tiny net on 256 examples (8 batches of 32) and on 250
(7 of 32 and a last one of 26), alternating, medians over ``--rounds``: what an epoch's last,
smaller batch adds. To compare two versions of the library, run this file with each version
first on ``PYTHONPATH`` (``PYTHONPATH=<checkout> python benchmarks/startup.py --last-batch``).

``--repeat``: four one-step fits of the tiny net in a row with no collection between them (as a
comparison of families or a sweep over seeds runs them), their results kept or dropped: what the
second and later fits pay beyond the first (medians over ``--rounds``, after a warm-up round).

``--phases``: where the compiled loss's start-up goes, on the tiny net's diagonal family with
one thread: tracing, the three check runs of the new graph and the eager loss it is checked
against, then the forward and the backward of the first three steps (loss and ``backward`` by
hand, no optimiser), each also in the plan's steady steps; for the traced order (the CPU's plan,
``zoo.inference.compiled.OPTIMISED_EXECUTION``) and the re-planned graph (CUDA's), medians over
``--rounds``.

``--imports``: what a process pays before its first line of work (every Lightning rank, HMC
chain, command-line call and test worker pays it): fresh interpreters running ``import torch,
pyro``, ``import zoo`` and ``python -m zoo --help``, alternating, medians over ``--rounds``
(target: the zoo at most 1.3 times torch + pyro).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import time

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


def epoch_fit(n: int) -> float:
    """Wall time of a one-epoch fit of the tiny net on its first ``n`` examples (batch 32)."""
    make, (x, y), batch = problem("tiny")
    gc.collect()
    start = time.perf_counter()
    zoo.fit(make(), "diagonal", (x[:n], y[:n]), epochs=1, batch_size=batch, seed=0,
            **grouped({"progress": False}))  # fmt: skip
    return time.perf_counter() - start


def last_batch_table(rounds: int) -> dict[int, float]:
    """The ``--last-batch`` table: median one-epoch fit per data size (seconds)."""
    sizes = (256, 250)
    epoch_fit(250)  # warm-up, not counted
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            times[n].append(epoch_fit(n))
    medians = {n: statistics.median(t) for n, t in times.items()}
    print(f"zoo from {os.path.dirname(zoo.__file__)}")
    print("| examples | minibatches | one-epoch fit ms |")
    print("| ---: | --- | ---: |")
    print(f"| 256 | 8 x 32 | {medians[256] * 1e3:.0f} |")
    print(f"| 250 | 7 x 32 + 26 | {medians[250] * 1e3:.0f} |")
    return medians


def repeat_table(rounds: int, count: int = 4) -> dict[str, list[float]]:
    """The ``--repeat`` table: one-step fits of the tiny net's diagonal family in a row, no
    collection between them, each result kept (as a comparison or a seed sweep keeps them) or
    dropped; median wall time of the k-th fit (seconds)."""
    make, data, batch = problem("tiny")
    times: dict[str, list[list[float]]] = {"kept": [[] for _ in range(count)]}
    times["dropped"] = [[] for _ in range(count)]
    for r in range(rounds + 1):  # the first round warms up, not counted
        for mode in times:
            kept = []
            gc.collect()  # the round starts clean: what is timed is the fits' own doing
            for k in range(count):
                start = time.perf_counter()
                fit = zoo.fit(make(), "diagonal", data, num_steps=1, batch_size=batch, seed=k,
                              **grouped({"progress": False}))  # fmt: skip
                if r:
                    times[mode][k].append(time.perf_counter() - start)
                if mode == "kept":
                    kept.append(fit)
                del fit
    medians = {mode: [statistics.median(t) for t in ks] for mode, ks in times.items()}
    print(f"zoo from {os.path.dirname(zoo.__file__)}")
    print("| fit | results kept ms | results dropped ms |")
    print("| ---: | ---: | ---: |")
    for k in range(count):
        print(f"| {k + 1} | {medians['kept'][k] * 1e3:.1f} | {medians['dropped'][k] * 1e3:.1f} |")
    return medians


#: The ``--phases`` rows: what the compiled loss does before and in its first steps.
PHASES = (
    "trace (TorchScript's tracer on Pyro's ELBO)",
    "check run 1 (the executor profiles)",
    "check run 2 (the executor re-plans; none in the traced order)",
    "check run 3 (the plan every step runs)",
    "eager loss for the check",
    "step 1: forward",
    "step 1: backward",
    "step 2: forward",
    "step 2: backward",
    "step 3: forward",
    "step 3: backward",
    "steady step (forward + backward)",
)


def phases_run(optimised: bool, steady_steps: int = 40) -> list[float]:
    """One measurement of :data:`PHASES` (seconds) on the tiny net's diagonal family: the
    objective's first loss (tracing and checking its graph), then loss and backward by hand."""
    import guides
    import zoo.inference.compiled

    make, (x, y), batch = problem("tiny")
    xb, yb = x[:batch], y[:batch]
    runs: list[float] = []
    trace_time: list[float] = []
    checked_time: list[float] = []
    compiled = zoo.inference.compiled
    trace, call, checked = (compiled.trace, compiled.ExecutorSetting.__call__,
                            compiled.TracedLoss._checked)  # fmt: skip

    def timed(fn, into):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            into.append(time.perf_counter() - start)
            return out

        return wrapper

    zoo.inference.compiled.trace = timed(trace, trace_time)
    zoo.inference.compiled.ExecutorSetting.__call__ = timed(call, runs)
    zoo.inference.compiled.TracedLoss._checked = timed(checked, checked_time)
    try:
        model = make()
        objective = zoo.Objective(model, guides.get("diagonal")(model), jit=True)
        objective.setup(xb, yb, batch_size=batch)
        steps = []
        for _ in range(3 + steady_steps):
            start = time.perf_counter()
            loss = objective.loss(xb, yb, len(x))
            middle = time.perf_counter()
            loss.backward()
            steps.append((middle - start, time.perf_counter() - middle))
    finally:
        zoo.inference.compiled.trace = trace
        zoo.inference.compiled.ExecutorSetting.__call__ = call
        zoo.inference.compiled.TracedLoss._checked = checked
    assert len(checked_time) == 1, "the graph was not built once"
    check = runs[
        : zoo.inference.compiled.CHECK_RUNS if optimised else 1
    ]  # the traced order runs once
    eager_check = checked_time[0] - trace_time[0] - sum(check)
    check += [float("nan")] * (3 - len(check))
    first = [steps[0][0] - checked_time[0], steps[0][1], *steps[1], *steps[2]]
    steady = statistics.median(f + b for f, b in steps[3 + steady_steps // 2 :])
    return [trace_time[0], *check, eager_check, *first, steady]


def phases_table(rounds: int) -> dict[str, list[float]]:
    """The ``--phases`` table: medians over ``rounds`` (after a warm-up round) per plan."""
    results: dict[str, list[list[float]]] = {"re-planned": [], "traced order": []}
    for r in range(rounds + 1):
        for plan in results:
            gc.collect()
            values = phases_run(plan == "re-planned")
            if r:
                results[plan].append(values)
    medians = {plan: [statistics.median(v) for v in zip(*rows)] for plan, rows in results.items()}
    steady = {plan: m[-1] for plan, m in medians.items()}
    print("| phase | re-planned ms | in its steady steps | traced order ms | in its steady steps |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for i, name in enumerate(PHASES):
        cells = " | ".join(
            f"{m[i] * 1e3:.1f} | {m[i] / steady[plan]:.1f}" if m[i] == m[i] else "- | -"
            for plan, m in medians.items()
        )
        print(f"| {name} | {cells} |")
    total = {
        plan: math.fsum(v for v in m[:-1] if v == v) - 3 * m[-1] for plan, m in medians.items()
    }
    cells = " | ".join(f"{t * 1e3:.1f} | {t / steady[p]:.0f}" for p, t in total.items())
    print(f"| start-up: all of the above but the steady step, less 3 steady steps | {cells} |")
    return medians


#: What each ``--imports`` process runs: the libraries under the zoo, the zoo, its command line.
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
    parser.add_argument("--last-batch", action="store_true", help="see the module docstring")
    parser.add_argument("--repeat", action="store_true", help="see the module docstring")
    parser.add_argument("--phases", action="store_true", help="see the module docstring")
    parser.add_argument("--imports", action="store_true", help="see the module docstring")
    args = parser.parse_args(argv)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)", flush=True)
    extra = {
        "last_batch": last_batch_table,
        "repeat": repeat_table,
        "phases": phases_table,
        "imports": imports_table,
    }
    chosen = [fn for flag, fn in extra.items() if getattr(args, flag)]
    if chosen:
        chosen[0](args.rounds)
        print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
        return []
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
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
    return rows


if __name__ == "__main__":
    main()
