"""Epochs of LeNet-5 on MNIST as a user meets them: a cold first epoch and the steady step, per
family, against hand-written Bayes by Backprop.

    python benchmarks/epoch_time.py --data ../shared/datasets                 # CPU
    python benchmarks/epoch_time.py --data ../shared/datasets --device cuda   # a GPU

Per row, on MNIST (all 60,000 images unless ``--limit``), LeNet-5 with 100 hidden units, batch
128, ``zoo.fit``'s defaults (on CUDA the CUDA-graph step, ``cuda_graph="auto"``; each family
again with ``cuda_graph=False`` beside it):

- **cold first epoch**: the wall time of a one-epoch ``zoo.fit`` of a new model, its set-up
  (tracing, checks, warm-up, capture) included, the data already in memory;
- **steady step**: in one fit of ``--epochs`` epochs, the time of every step after the first
  epoch divided by their number, data handling included (shuffles, minibatches, the host's reads
  at epoch ends), measured by events recorded inside the fit (CUDA events on a GPU, the host's
  clock on the CPU: ``step_time.StepMarks``), never as a difference of two fits.

The hand-written rows run the same epochs of the same minibatches in a plain loop: Bayes by
Backprop (``w = mu + softplus(rho) eps``, analytic KL to ``N(0, 1)``) with torch's default Adam
and with fused Adam, and on CUDA the floor: the fused step captured whole in one CUDA graph on a
fixed batch. bayesian-torch gets a row when it is installed. A time that is not positive is
refused (``step_time.check_times``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import StepMarks, bayesian_torch, bbb, check_times, sync  # noqa: E402

import guides  # noqa: E402
import zoo  # noqa: E402
from zoo.models.lenet import LeNet5Network  # noqa: E402

BATCH = 128


def hand_epochs(step, x, y, epochs: int, device) -> tuple[float, float]:
    """``(first epoch s, steady s per step)`` of ``step`` over shuffled minibatches."""
    n = len(x)
    per_epoch = -(-n // BATCH)
    g = torch.Generator().manual_seed(0)
    first = steady = 0.0
    for epoch in range(epochs):
        sync(device)
        start = time.perf_counter()
        perm = torch.randperm(n, generator=g).to(device)
        for i in range(0, n, BATCH):
            idx = perm[i : i + BATCH]
            step(x[idx], y[idx], n)
        sync(device)
        seconds = time.perf_counter() - start
        if epoch == 0:
            first = seconds
        else:
            steady += seconds
    return first, steady / max((epochs - 1) * per_epoch, 1)


def graph_floor(x, y, epochs: int, device) -> tuple[float, float]:
    """The fused hand-written step captured whole in one CUDA graph on a fixed batch (CUDA)."""
    step, opt, _ = bbb(LeNet5Network(100).to(device), fused=True)
    for group in opt.param_groups:
        group["capturable"] = True
    xs, ys = x[:BATCH].clone(), y[:BATCH].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(xs, ys, len(x))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step(xs, ys, len(x))
    steps = (epochs - 1) * -(-len(x) // BATCH)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    return float("nan"), start.elapsed_time(end) / 1e3 / max(steps, 1)


def zoo_epochs(family: str, data, epochs: int, device, **engine) -> tuple[float, float]:
    """``(cold one-epoch fit s, steady s per step)`` of ``zoo.fit`` with ``family``."""
    options = dict(batch_size=BATCH, seed=0, run=zoo.Run(progress=False))
    engine = zoo.Engine(device=device, **engine)
    sync(device)
    start = time.perf_counter()
    zoo.fit(zoo.models.LeNet5(hidden=100), family, data, epochs=1, engine=engine, **options)
    sync(device)
    cold = time.perf_counter() - start
    per_epoch = -(-len(data[0]) // BATCH)
    with StepMarks(per_epoch, epochs * per_epoch, device) as marks:
        zoo.fit(
            zoo.models.LeNet5(hidden=100), family, data, epochs=epochs, engine=engine, **options
        )
    return cold, marks.seconds() / ((epochs - 1) * per_epoch)


def rows(args, data, device) -> dict[str, tuple[float, float]]:
    x, y = data
    out = {}
    for fused in (False, True):
        step, _, _ = bbb(LeNet5Network(100).to(device), fused=fused or None)
        out[f"hand-written BBB, {'fused' if fused else 'default'} Adam"] = hand_epochs(
            step, x, y, args.epochs, device
        )
    if device.type == "cuda":
        out["floor: fused BBB step, one CUDA graph, fixed batch"] = graph_floor(
            x, y, args.epochs, device
        )
    try:
        out["bayesian-torch"] = bayesian_torch_epochs(x, y, args.epochs, device)
    except ImportError:
        print("bayesian-torch is not installed: its row is left out")
    for family in args.families or guides.available():
        out[f"zoo {family}"] = zoo_epochs(family, data, args.epochs, device)
        if device.type == "cuda":
            out[f"zoo {family}, no CUDA graph"] = zoo_epochs(
                family, data, args.epochs, device, cuda_graph=False
            )
    return out


def bayesian_torch_epochs(x, y, epochs: int, device) -> tuple[float, float]:
    step, _ = bayesian_torch(LeNet5Network(100), device)
    return hand_epochs(step, x, y, epochs, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="MNIST root (default: $ZOO_DATA)")
    parser.add_argument("--limit", type=int, default=None, help="training images (default all)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the steady fit (>= 2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--families", nargs="+", default=None, choices=guides.available())
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is not steady)")
    device = torch.device(args.device)
    train = zoo.data.mnist(args.data, limit=args.limit)
    x, y = (t.to(device) for t in train.tensors)
    torch.manual_seed(0)
    table = rows(args, (x, y), device)
    check_times({name: [steady] for name, (_, steady) in table.items()})
    floor = table["hand-written BBB, default Adam"][1]
    diag = table["zoo diagonal"][1] if "zoo diagonal" in table else float("nan")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\nLeNet-5, {len(x):,} images, batch {BATCH}, {args.epochs} epochs, {where}, "
        f"{torch.get_num_threads()} threads; load {os.getloadavg()[0]:.2f} (1-minute average)\n"
    )
    print("| method | cold first epoch s | steady ms / step | x hand-written | x zoo diagonal |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (cold, steady) in table.items():
        cold_text = "-" if cold != cold else f"{cold:.2f}"
        print(
            f"| {name} | {cold_text} | {1e3 * steady:.2f} | {steady / floor:.2f} "
            f"| {steady / diag:.2f} |"
        )


if __name__ == "__main__":
    main()
