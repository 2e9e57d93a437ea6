"""What a fit really holds against what ``guides.memory`` counts before allocating it.

    python benchmarks/step_memory.py                 # every family and variant, 256-2000-2000-10
    python benchmarks/step_memory.py --width 3000    # 9.8M weights: the count scales with them
    python benchmarks/step_memory.py --width 300 --families diagonal   # a smoke run

Each family fits a 256-w-w-10 classifier (three steps, batch 64, a given rate: no rate test) in
one child process. The child first runs the same fit on a tiny network, so that the code and
caches a fit loads are in memory before the measurement; then it resets the kernel's peak
(``/proc/self/clear_refs``), builds the guide and fits, and reads the peak resident memory
(``VmHWM``) less the resident memory before. The child's allocator returns every block of 64 KB
or more to the system when it is freed (``MALLOC_MMAP_THRESHOLD_``), so the peak is that of the
live tensors, not of what the allocator kept. The count is ``guide.fit_memory()``
(:mod:`guides.memory`): the peak should be at most a little above it (activations, the data and
the allocator's small blocks are not counted). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import suite

HERE = Path(__file__).resolve().parent


def cases() -> dict[str, tuple[str, dict]]:
    """``label -> (family, options)``: each registered family of ``guides/`` and its variants."""
    import guides

    out = {}
    for name, cls in guides.registry.families().items():
        if cls.__module__.startswith("guides."):
            for variant, options in cls.variants.items():
                out[f"{name}_{variant}" if variant else name] = (name, dict(options))
    return out


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(width: int, labels: list[str]) -> list[dict]:
    """Each case's measured peak and count, fitted here in turn."""
    import gc
    import warnings

    import torch

    sys.path.insert(0, str(HERE.parent))
    import guides
    import zoo

    warnings.simplefilter("ignore")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    table, rows = cases(), []

    def fit(family: str, options: dict, hidden: int):
        model = zoo.models.BayesianMLP(256, (hidden, hidden), 10, task="classification")
        guide = guides.get(family)(model, **options)
        gc.collect()
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak from here
        result = zoo.fit(model, guide, (x, y), num_steps=3, batch_size=64, lr=1e-3,
                         loss=zoo.Loss(map_start=False), run=zoo.Run(progress=False))  # fmt: skip
        return result, model, _status("VmHWM") - before

    for label in labels:
        family, options = table[label]
        fit(family, options, 8)
        result, model, peak = fit(family, options, width)
        weights = sum(torch.Size(s).numel() for s in model.site_shapes.values())
        rows.append({
            "family": label,
            "weights": weights,
            "parameters": result.guide.num_variational_parameters(),
            "counted": result.guide.fit_memory(),
            "peak": peak,
        })  # fmt: skip
        del result, model
        gc.collect()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2000, help="the two hidden layers' width")
    p.add_argument("--families", nargs="+", default=None, help="labels (default: every case)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="default: benchmarks/results/step_memory.json")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    labels = args.families or sorted(cases())
    unknown = sorted(set(labels) - set(cases()))
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {sorted(cases())}")
    if args.child:
        print(json.dumps(child(args.width, labels)))
        return
    with suite.record("step_memory", args.out, argv):
        if not os.path.exists("/proc/self/clear_refs"):
            raise SystemExit("needs Linux's /proc/self/clear_refs to reset the peak")
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        command = [sys.executable, __file__, "--child", "--width", str(args.width), "--families"]
        done = subprocess.run(
            command + labels, capture_output=True, text=True, env=env, timeout=3600
        )
        if done.returncode:
            raise SystemExit(done.stderr[-4000:])
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"256-{args.width}-{args.width}-10, batch 64, 3 steps; load {os.getloadavg()[0]:.2f}")
        print()
        print(
            "| family | weights | parameters / weight | counted MiB | peak MiB | peak / counted |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(
                f"| {r['family']} | {r['weights']:,} | {r['parameters'] / r['weights']:.2f} "
                f"| {r['counted'] / 2**20:,.0f} | {r['peak'] / 2**20:,.0f} "
                f"| {r['peak'] / r['counted']:.2f} |"
            )


if __name__ == "__main__":
    main()
