"""The compiled loss with and without TorchScript's executor re-planning, side by side.

    python benchmarks/executor_order.py --device cuda                  # LeNet-5, batch 128
    python benchmarks/executor_order.py --device cpu --net tiny        # 13-50-1, batch 32
    python benchmarks/executor_order.py --device cuda --families diagonal tridiagonal

``zoo.inference.compiled.OPTIMISED_EXECUTION`` says per device whether a compiled graph may run
re-planned (TorchScript's optimised executor: fused elementwise kernels, and possibly another order
of the random draws than the traced one, which the compiled loss's check then refuses) or in the
traced order, for a whole fit. For each family
this times a ``zoo.fit`` step both ways in one process, alternating, and
prints the per-step times and their ratio: steps ``warm .. warm + steps`` of a fit, synchronised
with the device, best of ``--rounds``; and each plan's start-up, what the fit's first ``warm`` (20)
steps cost beyond as many of its steady steps (tracing, the executor's profiling and optimising
runs, the check against the eager loss). On CUDA also with ``cuda_graph=True``. Each family runs in
its own process (a failed CUDA-graph capture must not spoil the next row).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

NETS = {"lenet5": 128, "tiny": 32}


def per_step(family, net, device, graph, optimised, steps, warm) -> tuple[float, float, str]:
    """(steady ms per step, start-up ms, how the loss ran) of one fit."""
    import zoo
    import zoo.inference.compiled
    from zoo.training.options import grouped

    zoo.inference.compiled.OPTIMISED_EXECUTION[device.type] = optimised
    g = torch.Generator().manual_seed(0)
    batch = NETS[net]
    if net == "lenet5":
        model = zoo.models.LeNet5()
        x, y = torch.randn(batch * 8, 1, 28, 28, generator=g), torch.randint(0, 10, (batch * 8,))
    else:
        model = zoo.models.BayesianMLP(13, (50,), noise=1.0)
        x, y = torch.randn(batch * 8, 13, generator=g), torch.randn(batch * 8, generator=g)
    marks = []

    def mark(state):
        if state.step in (warm, warm + steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

    options = {"cuda_graph": bool(graph)}
    start = time.perf_counter()
    fit = zoo.fit(
        model,
        family,
        (x, y),
        num_steps=warm + steps + 1,
        batch_size=batch,
        **grouped({"progress": False, "callbacks": [mark], "device": device, **options}),
    )
    steady = (marks[1] - marks[0]) / steps
    return steady * 1e3, (marks[0] - start - warm * steady) * 1e3, fit.options["jit"]


def row(family: str, args) -> None:
    device = torch.device(args.device)
    for graph in (False, True) if device.type == "cuda" else (False,):
        best: dict[bool, float] = {}
        start_up: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for optimised in (True, False):
                ms, first, jit = per_step(
                    family, args.net, device, graph, optimised, args.steps, 20
                )
                best[optimised] = min(best.get(optimised, float("inf")), ms)
                start_up[optimised].append(first)
        median = {k: statistics.median(v) for k, v in start_up.items()}
        print(
            f"| {family} | {'yes' if graph else 'no'} | {best[True]:.3f} | {best[False]:.3f} | "
            f"{best[False] / best[True]:.2f} | {median[True]:.0f} | {median[False]:.0f} | {jit} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--net", default="lenet5", choices=NETS)
    parser.add_argument("--families", nargs="+", default=["diagonal", "mc_dropout", "tridiagonal"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row is not None:
        return row(args.row, args)
    print(f"device {args.device}, net {args.net}, load {os.getloadavg()[0]:.2f}")
    print(
        "| family | CUDA graph | re-planned ms | traced order ms | ratio | re-planned start-up "
        "ms | traced order start-up ms | loss |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for family in args.families:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--row", family]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"| {family} | failed: {last[:150]} |")
        else:
            print(done.stdout, end="")


if __name__ == "__main__":
    main()
