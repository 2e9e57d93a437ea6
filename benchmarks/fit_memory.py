"""Memory a process keeps per finished fit: many small fits in a row, each dropped, the
process's resident memory measured after a warm-up and after the rest.

    python benchmarks/fit_memory.py                 # 60 fits per row, the diagonal family
    python benchmarks/fit_memory.py --families all  # every registered family, in turn
    python benchmarks/fit_memory.py --fits 3 --warmup 1   # a smoke run

Rows, each in a fresh process so that one row's memory does not count in another's: the
compiled loss as the library traces it (``zoo.inference.compiled.trace``: a compilation unit per
graph), the same fits with ``torch.jit.trace`` in its place (what the library did before, which
keeps every traced function in TorchScript's process-wide unit), and the eager loss (``jit=False``,
no graph). Growth is MiB of resident memory per fit after ``gc.collect()``; Linux only
(``/proc/self/statm``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = {
    "zoo.inference.compiled.trace": "compiled loss, a compilation unit per graph",
    "torch.jit.trace": "compiled loss, torch.jit.trace (before)",
    "eager": "eager loss (jit=False)",
}


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(row: str, fits: int, warmup: int, families: list[str]) -> dict:
    """Run ``warmup + fits`` fits of ``row``'s kind here; returns the growth."""
    import gc
    import warnings

    import torch

    sys.path.insert(0, str(HERE.parent))
    import zoo
    import zoo.inference.compiled

    warnings.simplefilter("ignore")
    if row == "torch.jit.trace":
        zoo.inference.compiled.trace = lambda f, inputs: torch.jit.trace(
            f, inputs, check_trace=False
        )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x[:, 0] - x[:, 1]
    jit = row != "eager"

    def one(i: int) -> None:
        model = zoo.models.BayesianMLP(3, (16,), noise=1.0)
        result = zoo.fit(
            model, families[i % len(families)], (x, y), num_steps=12, batch_size=32, seed=i,
            engine=zoo.Engine(jit=jit), run=zoo.Run(progress=False),
        )  # fmt: skip
        del result, model
        gc.collect()

    for i in range(warmup):
        one(i)
    start = resident_mib()
    for i in range(warmup, warmup + fits):
        one(i)
    end = resident_mib()
    return {"start": start, "end": end, "per_fit": (end - start) / fits}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", type=int, default=60, help="measured fits per row")
    p.add_argument("--warmup", type=int, default=8, help="fits before the first measurement")
    p.add_argument("--families", default="diagonal", help="comma-separated, or 'all'")
    p.add_argument("--child", choices=list(ROWS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.families == "all":
        sys.path.insert(0, str(HERE.parent))
        import guides

        families = guides.available()
    else:
        families = args.families.split(",")
    if args.child:
        print(json.dumps(child(args.child, args.fits, args.warmup, families)))
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"fits per row: {args.fits} after {args.warmup} (families: {', '.join(families)}); "
          f"load {load:.2f}")  # fmt: skip
    print("| row | MiB at start | MiB at end | MiB per fit |")
    print("| --- | ---: | ---: | ---: |")
    for row, label in ROWS.items():
        cmd = [sys.executable, __file__, "--child", row, "--fits", str(args.fits),
               "--warmup", str(args.warmup), "--families", ",".join(families)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        found = json.loads(out.strip().splitlines()[-1])
        print(f"| {label} | {found['start']:.1f} | {found['end']:.1f} | "
              f"{found['per_fit']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
