"""The numbers behind ``zoo.fit``'s thread rule (:mod:`zoo.threads`): the step time of the diagonal
family at one thread and at all threads, alone and beside a competing CPU-bound process, across
network sizes, with the fused and the ``foreach`` Adam.

    python benchmarks/threads.py                     # every size, 5 interleaved rounds
    python benchmarks/threads.py --sizes tiny mlp    # some of them

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
import time
from collections import defaultdict
from pathlib import Path

import torch

import guides
import zoo
from zoo.models.lenet import LeNet5Network
from zoo.models.mlp import mlp_network
from zoo.threads import SMALL_FORWARD_FLOPS, forward_flops

sys.path.insert(0, str(Path(__file__).parent))
from step_time import Competitor  # noqa: E402  (the same competing process)

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
OPTIMIZERS = {"fused": {"fused": True}, "foreach": {"foreach": True}}


class Setting:
    """One network fitted with one thread count and optimiser; its step times."""

    def __init__(self, size: str, threads: int, optimizer: str):
        build, shape, batch, task = SIZES[size]
        torch.manual_seed(0)
        net = build()
        if task == "regression":
            self.model = zoo.models.BayesianModel(net, task=task, noise=1.0)
            y = torch.randn(batch)
        else:
            self.model = zoo.models.BayesianModel(net, task=task)
            y = torch.randint(0, 10, (batch,))
        self.data = (torch.randn((batch,) + shape), y)
        self.guide = guides.get("diagonal")(self.model)
        self.threads, self.optimizer = threads, optimizer
        self.flops = forward_flops(self.model, *self.data)

    def run(self, steps: int) -> list[float]:
        stamps = []
        zoo.fit(
            self.model,
            self.guide,
            self.data,
            num_steps=steps + 1,
            batch_size=len(self.data[0]),
            progress=False,
            threads=self.threads,
            optimizer_options=OPTIMIZERS[self.optimizer],
            callbacks=[lambda state: stamps.append(time.perf_counter())],
        )
        return [b - a for a, b in zip(stamps[:-1], stamps[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per setting per round")
    parser.add_argument("--no-contended", action="store_true", help="idle rounds only")
    args = parser.parse_args()
    most = torch.get_num_threads()
    counts = sorted({1, most})
    settings = {
        (size, n, opt): Setting(size, n, opt)
        for size in args.sizes
        for n in counts
        for opt in OPTIMIZERS
    }
    times = defaultdict(list)
    conditions = ["idle"] if args.no_contended else ["idle", "contended"]
    for _ in range(args.rounds):
        for condition in conditions:
            with Competitor() if condition == "contended" else contextlib.nullcontext():
                for key, setting in settings.items():
                    times[key + (condition,)] += setting.run(args.steps)
    print(
        f"\ndiagonal family, {args.rounds} rounds x {args.steps} steps, medians in ms / step; "
        f"{os.cpu_count()} CPUs, threads 1 and {most}; load {os.getloadavg()[0]:.2f} "
        f"(1-minute average); the rule: one thread below {SMALL_FORWARD_FLOPS / 1e6:g} MFLOP\n"
    )
    columns = [(n, opt, c) for c in conditions for opt in OPTIMIZERS for n in counts]
    print(
        "| net, batch | forward MFLOP | "
        + " | ".join(f"{c}, {opt}, {n} thr." for n, opt, c in columns)
        + " | rule |"
    )
    print("| --- | ---: | " + " | ".join("---:" for _ in columns) + " | --- |")
    for size in args.sizes:
        setting = settings[(size, counts[0], "fused")]
        cells = [
            f"{1e3 * statistics.median(times[(size, n, opt, c)]):.2f}" for n, opt, c in columns
        ]
        rule = "1" if setting.flops < SMALL_FORWARD_FLOPS else f"{most}"
        head = f"| {size}, {SIZES[size][2]} | {setting.flops / 1e6:.3g} | "
        print(head + " | ".join(cells) + f" | {rule} |")


if __name__ == "__main__":
    main()
