"""Peak memory of a prediction: weight draws in blocks (the library) against every draw at
once (what ``predict`` did before, and what ``guide.sample_posterior(S)`` followed by one pass
per draw does).

    python benchmarks/predict_memory.py                       # the issue's two networks
    python benchmarks/predict_memory.py --widths 256 --samples 50 --rows 20   # a smoke run

Each row runs in a fresh process and reports its peak resident memory (``ru_maxrss``) and
the resident memory before the prediction (the interpreter, torch, the fit's parameters), so
one row's memory never counts in another's. Networks: MLPs 784-w-w-10 with a diagonal guide
after a few steps on random MNIST-shaped data (no download); ``w = 1024`` has 1.9M weights,
``w = 2048`` 5.8M. A ``check`` row (not timed) compares the streamed prediction with the
whole-array one on the same draws (``predict_draws(sample(S))``): the largest difference of the
outputs, and of ``evaluate``'s metrics against the metrics of the whole prediction.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import suite

HERE = Path(__file__).resolve().parent


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def child(mode: str, width: int, samples: int, rows: int) -> dict:
    import warnings

    import torch

    sys.path.insert(0, str(HERE.parent))
    import zoo
    from zoo.runtime.rng import seeded

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 784, generator=g)
    y = torch.randint(0, 10, (256,), generator=g)
    model = zoo.models.BayesianMLP(784, (width, width), 10, task="classification")
    quiet = zoo.Run(progress=False)
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=3, batch_size=64, run=quiet)
    weights = sum(p.numel() for p in fit.model.net.parameters())
    test, labels = x[:rows], y[:rows]
    before = resident_mib()
    start = time.perf_counter()
    out: dict = {"mode": mode, "width": width, "weights": weights, "samples": samples}
    if mode == "blocks":
        fit.predict(test, num_samples=samples, progress=False, threads=1)
    elif mode == "evaluate":
        fit.evaluate((test, labels), num_samples=samples, progress=False, threads=1)
    elif mode == "whole":  # the draws of one sample_posterior(S) call, then one pass per draw
        with torch.no_grad(), seeded(0):
            draws = fit.guide.sample_posterior(samples)
        fit.predict_draws(test, draws)
    elif mode == "check":
        streamed = fit.predict(test, num_samples=samples, progress=False)
        whole = fit.predict_draws(test, fit.sample(samples))
        out["max_output_difference"] = (streamed.outputs - whole.outputs).abs().max().item()
        metrics = fit.evaluate((test, labels), num_samples=samples, progress=False)
        expected = fit.model.likelihood.metrics(whole, labels)
        out["max_metric_difference"] = max(abs(metrics[k] - expected[k]) for k in metrics)
    out["seconds"] = time.perf_counter() - start
    out["before_mib"] = before
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run(mode: str, width: int, samples: int, rows: int) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--widths", str(width),
               "--samples", str(samples), "--rows", str(rows)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        return {"mode": mode, "width": width, "samples": samples, "failed": done.stderr[-400:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--samples", type=int, nargs="+", default=[500, 1000])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--whole-max-gib", type=float, default=8.0,
                        help="skip the whole-array row when its draws alone need more")  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", default=None, help="default: benchmarks/results/predict_memory.json"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.widths[0], args.samples[0], args.rows)))
        return
    with suite.record("predict_memory", args.out):
        print("| weights | draws | mode | peak MiB | MiB before predicting | added MiB | seconds |")
        print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for width, samples in zip(args.widths, args.samples):
            modes = ["blocks", "evaluate", "whole"]
            per_draw = 4 * (784 * width + width * width + 10 * width + 2 * width + 10)
            if per_draw * samples / 2**30 > args.whole_max_gib:
                modes.remove("whole")
            for mode in modes:
                r = run(mode, width, samples, args.rows)
                if "failed" in r:
                    print(f"| {width} | {samples} | {mode} | failed: {r['failed']!r} | | | |")
                    continue
                added = r["peak_mib"] - r["before_mib"]
                cells = [f"{r['weights']:,}", samples, mode, f"{r['peak_mib']:.0f}",
                         f"{r['before_mib']:.0f}", f"{added:.0f}",
                         f"{r['seconds']:.1f}"]  # fmt: skip
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
            check = run("check", width, min(samples, 100), args.rows)
            print(f"check (w={width}, {min(samples, 100)} draws): {json.dumps(check)}", flush=True)


if __name__ == "__main__":
    main()
