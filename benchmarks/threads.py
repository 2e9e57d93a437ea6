"""The numbers behind ``zoo.fit``'s step rules on the CPU: the thread count
(:mod:`zoo.runtime.threads`) and the compiled loss (:mod:`zoo.inference.compiled`). The step time
of one family at one thread and at all threads, with the eager and the compiled loss, alone and
beside a competing CPU-bound process, across network sizes.

    python benchmarks/threads.py                           # diagonal, every size, 5 rounds
    python benchmarks/threads.py --family lowrank --sizes tiny mlp
    python benchmarks/threads.py --optimizers              # fused vs foreach Adam instead

Each row is one network and minibatch (its forward pass's floating-point operations, as the rule
counts them); each cell the median step time over the rounds. Rounds interleave every setting, so
a change in the machine's load hits them alike; note the load printed with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

from zoo.models.lenet import LeNet5Network
from zoo.models.mlp import mlp_network
from zoo.runtime.threads import SMALL_STEP_FLOPS, forward_flops

sys.path.insert(0, str(Path(__file__).parent))
from step_time import Competitor, ZooStep  # noqa: E402  (the same process and fit)

#: name -> (network builder, input shape, batch size, task)
SIZES = {
    "tiny": (lambda: mlp_network(13, (50,), 1), (13,), 32, "regression"),
    "diabetes": (lambda: mlp_network(10, (50,), 1), (10,), 398, "regression"),
    "mlp-50": (lambda: mlp_network(784, (50,), 10), (784,), 128, "classification"),
    "mlp-100": (lambda: mlp_network(784, (100,), 10), (784,), 128, "classification"),
    "mlp-200": (lambda: mlp_network(784, (200,), 10), (784,), 128, "classification"),
    "mlp": (lambda: mlp_network(784, (400, 400), 10), (784,), 128, "classification"),
    "lenet5": (lambda: LeNet5Network(100), (1, 28, 28), 128, "classification"),
}
#: The second dimension of the table: the loss (default) or the optimiser implementation.
LOSSES = {"eager": {"jit": False}, "compiled": {"jit": True}}
OPTIMIZERS = {
    "fused": {"optimizer_options": {"fused": True}},
    "foreach": {"optimizer_options": {"foreach": True}},
}


class Setting:
    """One network fitted with one thread count and one option set (a
    :class:`step_time.ZooStep`); its step times."""

    def __init__(self, size: str, family: str, threads: int, options: dict):
        build, shape, batch, task = SIZES[size]
        torch.manual_seed(0)
        x = torch.randn((batch,) + shape)
        y = torch.randn(batch) if task == "regression" else torch.randint(0, 10, (batch,))
        cpu = torch.device("cpu")
        self.step = ZooStep(build(), x, y, family, {}, cpu, threads=threads, **options)
        self.flops = forward_flops(self.step.model, x, y)

    def run(self, steps: int) -> list[float]:
        self.step.times = []
        self.step.run(steps)
        return self.step.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per setting per round")
    parser.add_argument("--no-contended", action="store_true", help="idle rounds only")
    parser.add_argument("--family", default="diagonal")
    parser.add_argument(
        "--optimizers", action="store_true", help="fused vs foreach Adam (eager loss)"
    )
    args = parser.parse_args()
    most = torch.get_num_threads()
    counts = sorted({1, most})
    kinds = OPTIMIZERS if args.optimizers else LOSSES
    if args.optimizers:
        kinds = {k: {**v, "jit": False} for k, v in OPTIMIZERS.items()}
    settings = {
        (size, n, kind): Setting(size, args.family, n, options)
        for size in args.sizes
        for n in counts
        for kind, options in kinds.items()
    }
    times = defaultdict(list)
    conditions = ["idle"] if args.no_contended else ["idle", "contended"]
    for _ in range(args.rounds):
        for condition in conditions:
            with Competitor() if condition == "contended" else contextlib.nullcontext():
                for key, setting in settings.items():
                    times[key + (condition,)] += setting.run(args.steps)
    print(
        f"\n{args.family} family, {args.rounds} rounds x {args.steps} steps, medians in ms / step; "
        f"{os.cpu_count()} CPUs, threads 1 and {most}; load {os.getloadavg()[0]:.2f} "
        f"(1-minute average); the rules (jit='auto', threads='auto'): one thread below "
        f"{SMALL_STEP_FLOPS / 1e6:g} MFLOP, compiled below {SMALL_STEP_FLOPS / 1e6:g} MFLOP\n"
    )
    columns = [(n, kind, c) for c in conditions for kind in kinds for n in counts]
    print(
        "| net, batch | forward MFLOP | "
        + " | ".join(f"{c}, {opt}, {n} thr." for n, opt, c in columns)
        + " | rules: threads, loss |"
    )
    print("| --- | ---: | " + " | ".join("---:" for _ in columns) + " | --- |")
    for size in args.sizes:
        setting = settings[(size, counts[0], next(iter(kinds)))]
        cells = [
            f"{1e3 * statistics.median(times[(size, n, opt, c)]):.2f}" for n, opt, c in columns
        ]
        rule = "1" if setting.flops < SMALL_STEP_FLOPS else f"{most}"
        rule += ", compiled" if setting.flops < SMALL_STEP_FLOPS else ", eager"
        head = f"| {size}, {SIZES[size][2]} | {setting.flops / 1e6:.3g} | "
        print(head + " | ".join(cells) + f" | {rule} |")


if __name__ == "__main__":
    main()
