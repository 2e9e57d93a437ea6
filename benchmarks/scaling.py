"""Examples per second of a LeNet-5 fit against the number of processes (zoo.fit on Lightning).

    python benchmarks/scaling.py --processes 1 2 --data ../shared/datasets
    python benchmarks/scaling.py --accelerator gpu --processes 1 2 4 8   # a GPU machine

Each configuration is a fresh ``python benchmarks/scaling.py --worker ...`` (Lightning starts
the other ranks as it does for a user's script), timed by the fit's own clock on rank 0 after a
warm-up fit of ``--warmup`` steps in the same processes, so start-up and imports are not
counted. Every rank takes ``--batch`` examples per step (the global batch grows with the
processes, as in data-parallel training), so throughput = steps x batch x processes / seconds;
scaling efficiency = throughput(k) / (k x throughput(1)), the single process having as many
threads as each of the k. On the CPU every process gets ``cores / k`` intra-op threads (one
core each on a 2-core machine), and the single process is also timed with all cores: the last
column compares with it, which is what k processes on the same cores can add.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import suite
import torch


def worker(args: argparse.Namespace) -> None:
    """One configuration: a warm-up fit, then the timed fit; rank 0 prints a JSON line."""
    import zoo
    from zoo.training.options import grouped

    (processes,) = args.processes
    train = zoo.data.mnist(args.data, limit=args.limit)
    common = dict(
        batch_size=args.batch,
        accelerator=args.accelerator,
        devices=processes,
        strategy="ddp" if processes > 1 else "auto",
        threads=args.threads,
        progress=False,
        jit=False,
    )
    if processes == 1:  # one process: zoo.fit's own path, on the accelerator's device
        del common["accelerator"], common["devices"], common["strategy"]
        common["device"] = "cuda" if args.accelerator == "gpu" else "cpu"
    common = grouped(common)
    zoo.fit(zoo.models.LeNet5(), "diagonal", train, num_steps=args.warmup, seed=1, **common)
    fit = zoo.fit(zoo.models.LeNet5(), "diagonal", train, num_steps=args.steps, seed=0, **common)
    if fit.options["world_size"] > 1 and torch.distributed.get_rank() != 0:
        return
    seconds = fit.wall_time
    print(
        json.dumps(
            {
                "processes": processes,
                "threads": fit.options["threads"],
                "seconds": seconds,
                "examples_per_second": args.steps * args.batch * processes / seconds,
                "device": str(fit.device),
            }
        ),
        flush=True,
    )


def run(args: argparse.Namespace, processes: int, threads: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
    cmd += ["--processes", str(processes), "--threads", str(threads)]
    for name in ("steps", "warmup", "batch", "limit", "accelerator", "data"):
        value = getattr(args, name)
        if value is not None:
            cmd += [f"--{name}", str(value)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("{"))
    return json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="examples per step per process")
    parser.add_argument("--limit", type=int, default=8192, help="training images")
    parser.add_argument("--data", default=None, help="MNIST root (default: $ZOO_DATA)")
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/scaling.json")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    with suite.record("scaling", args.out):
        cores = os.cpu_count() or 1
        print(f"load before: {os.getloadavg()[0]:.2f} (1-min average), {cores} CPUs", flush=True)
        rows = []
        for k in args.processes:
            threads = max(cores // k, 1) if args.accelerator == "cpu" else 1
            rows.append(run(args, k, threads))
            if k == 1 and args.accelerator == "cpu" and cores > 1 and 2 in args.processes:
                rows.append(run(args, 1, max(cores // 2, 1)))  # the per-process share of k=2
        base = {r["threads"]: r["examples_per_second"] for r in rows if r["processes"] == 1}
        whole = base[max(base)]  # one process on all cores
        print(
            "| processes | threads each | examples/s | scaling efficiency | vs 1 process on all "
            "cores | device |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            k, rate = r["processes"], r["examples_per_second"]
            same = base.get(r["threads"])  # one process with as many threads as each of the k
            efficiency = f"{rate / (k * same):.2f}" if same else "-"
            print(
                f"| {k} | {r['threads']} | {rate:.0f} | {efficiency} | {rate / whole:.2f}x "
                f"| {r['device']} |"
            )
        print(f"load after: {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
