"""The baselines beside every variational family on MNIST: LeNet-5, one epoch each.

    python benchmarks/baselines.py --data ../shared/datasets                # CPU
    python benchmarks/baselines.py --data ../shared/datasets --device cuda  # a GPU
    python benchmarks/baselines.py --rows diagonal "laplace LL-KFAC"       # some rows

Rows: every registered family (``zoo.fit``, its defaults), the Laplace approximation through
laplace-torch (last-layer KFAC, and all weights with a diagonal Hessian; the prior precision
by marginal likelihood, the GLM predictive), and a deep ensemble of 5 MAP networks. Every row
trains on the same images with the same options (one epoch of Adam at 1e-3, batch 128, seed 0;
a Laplace row's MAP fit is that epoch, an ensemble's members one epoch each).

Columns, on all 10,000 test images with ``--samples`` draws each: accuracy, NLL, ECE; the
AUROC of telling test digits from uniform-noise images and from test digits with their pixels
permuted (a fixed permutation), by predictive entropy; fit seconds (everything before the
first prediction: the MAP fit and the curvature for Laplace, all members for the ensemble);
the peak memory of the fit above what was held before it: on CUDA the allocator's peak (the
JSON also records what was allocated before, ``allocated_before``: it grows if earlier rows
leave memory behind), on the CPU (Linux) the peak resident set above the one before the fit,
each row in a process of its own (this script with ``--rows row``: a process that ran earlier
rows would reuse their freed memory and show less), its high-water mark reset before the fit
(``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import suite
import torch

import guides
import zoo
from zoo.metrics import ood_auroc

LAPLACE = {
    "laplace LL-KFAC": {"weights": "last_layer", "hessian": "kron", "prior_precision": "marglik"},
    "laplace all-diag": {"weights": "all", "hessian": "diag", "prior_precision": "marglik"},
}
ENSEMBLES = {"ensemble 5 MAP": {"members": 5, "family": "map"}}


def rows() -> list[str]:
    families = [name for name in guides.available() if name != "mixed"]
    return families + list(LAPLACE) + list(ENSEMBLES)


def model():
    return zoo.models.LeNet5(hidden=100)


def train(row: str, data, options: dict):
    """The row's fitted result (a FitResult, LaplaceFit or Ensemble)."""
    if row in LAPLACE:
        return zoo.laplace(model(), data, options=LAPLACE[row], **options)
    if row in ENSEMBLES:
        return zoo.ensemble(model, data, **ENSEMBLES[row], progress=False, **options)
    return zoo.fit(model(), row, data, **options)


def ood_sets(x_test: torch.Tensor, n: int, seed: int = 0):
    """Uniform-noise images and test digits with a fixed permutation of their pixels, each
    standardised like the digits (``n`` of each)."""
    g = torch.Generator().manual_seed(seed)
    mean, sd = x_test.mean(), x_test.std()
    noise = (torch.rand(n, *x_test.shape[1:], generator=g) - 0.5) / (12**-0.5) * sd + mean
    perm = torch.randperm(x_test[0].numel(), generator=g)
    permuted = x_test[:n].reshape(n, -1)[:, perm].reshape(n, *x_test.shape[1:])
    return {"noise": noise, "permuted": permuted}


def _status_mib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` of this process in MiB (Linux), else NaN."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident set to its current one (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(row, data, x_test, y_test, ood, args, device) -> dict:
    options = {"epochs": args.epochs, "seed": 0, "run": zoo.Run(progress=False)}
    options["engine"] = zoo.Engine(device=device)
    before, rss = 0.0, False
    if device.type == "cpu":
        gc.collect()
        rss = _reset_peak_rss()
        before = _status_mib("VmRSS")
    if device.type == "cuda":  # what earlier rows left allocated is not this row's
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    start = time.perf_counter()
    result = train(row, data, options)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = float("nan")
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20 - before
    elif rss:
        peak = _status_mib("VmHWM") - before
    pred = result.predict(x_test, num_samples=args.samples, progress=False)
    scores = result.model.likelihood.metrics(pred, y_test.to(pred.outputs.device))
    entropy_in = pred.entropy.cpu()
    out = {"row": row, "fit_seconds": seconds, "fit_peak_mib": peak, "allocated_before": before}
    out.update({k: scores[k] for k in ("accuracy", "nll", "ece")})
    for name, x in ood.items():
        other = result.predict(x, num_samples=args.samples, progress=False)
        out[f"auroc_{name}"] = ood_auroc(entropy_in, other.entropy.cpu())
    return out


def in_a_process(row: str) -> dict:
    """The row measured by this script run for it alone in a new process (the arguments of
    this run, ``--rows row``): its peak resident set is its own."""
    import subprocess
    import sys
    import tempfile

    argv = sys.argv[1:]
    keep, skip = [], False
    for arg in argv:  # this run's arguments without --rows and --out
        if arg in ("--rows", "--out"):
            skip = True
            continue
        if skip and arg.startswith("--"):
            skip = False
        if not skip:
            keep.append(arg)
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "row.json")
        cmd = [sys.executable, __file__, *keep, "--rows", row, "--out", out, "--alone"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["data"]["rows"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="MNIST root (default: $ZOO_DATA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=20, help="draws per test image")
    parser.add_argument("--ood", type=int, default=2000, help="images of each OOD set")
    parser.add_argument("--rows", nargs="+", default=None, help="default: every row")
    parser.add_argument("--train-limit", type=int, default=None, help="first N training images")
    parser.add_argument("--test-limit", type=int, default=None, help="first N test images")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/baselines.json")
    parser.add_argument("--alone", action="store_true", help="the rows in this process")
    args = parser.parse_args()
    chosen = args.rows or rows()
    unknown = sorted(set(chosen) - set(rows()))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {rows()}")
    root = args.data or os.environ.get("ZOO_DATA")
    data = zoo.data.mnist(root, limit=args.train_limit)
    x_test, y_test = zoo.data.mnist(root, train=False, limit=args.test_limit).tensors
    ood = ood_sets(x_test, args.ood)
    device = torch.device(args.device)
    with suite.record("baselines", args.out) as run:
        run.data = {
            "args": vars(args),
            "rows": table(chosen, data, x_test, y_test, ood, args, device),
        }


def table(chosen, data, x_test, y_test, ood, args, device) -> list[dict]:
    """Measure each row of ``chosen`` (on the CPU each in a process of its own, unless
    ``--alone``) and print the table."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"LeNet-5 (100 hidden), MNIST, {args.epochs} epoch(s), batch 128, seed 0, "
          f"{args.samples} draws per image; {where}")  # fmt: skip
    header = ["row", "fit s", "fit peak MiB", "accuracy", "NLL", "ECE", "AUROC noise",
              "AUROC permuted"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("| --- |" + " ---: |" * (len(header) - 1))
    results = []
    for row in chosen:
        if device.type == "cpu" and not args.alone:
            r = in_a_process(row)
        else:
            r = measure(row, data, x_test, y_test, ood, args, device)
        results.append(r)
        peak = "-" if r["fit_peak_mib"] != r["fit_peak_mib"] else f"{r['fit_peak_mib']:.0f}"
        print(
            f"| {row} | {r['fit_seconds']:.1f} | {peak} | {r['accuracy']:.4f} | {r['nll']:.4f} "
            f"| {r['ece']:.4f} | {r['auroc_noise']:.3f} | {r['auroc_permuted']:.3f} |",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
