"""Posch & Pilz's LeNet-5 recipe in full through ``zoo.fit``, evaluated as the paper evaluates it.

The paper (section IV-A): SGD with momentum 0.9, batch 64, learning rate
``0.01 (1 + 1e-4 i)^-0.75``, 100,000 iterations, a ``N(0, 1)`` prior on every parameter,
``nu = 1 / (60,000 * 100)`` (the KL term of the per-example loss down-weighted by 100) and
``kappa = 50`` (the correlation parameters learn 50 times faster); 200 sampled networks per test
image, all 10,000 test images. ``--family diagonal`` runs the same recipe with a mean-field
posterior (no correlation parameter, so no ``kappa``).

It writes ``<out>/<family>_<hidden>.json`` (test error, NLL, ECE, Table II's ``tau``/``rho`` per
layer for the tridiagonal family, Table III's counts, the loss curve, fit time, device, load,
command) and ``<out>/<family>_<hidden>.fit`` (``fit.save``; ``zoo.load`` reads it). The fit
checkpoints into ``<checkpoints>/<family>_<hidden>.ckpt`` every ``--checkpoint-every`` steps and a
second run of the same command resumes from there.

    python benchmarks/posch_pilz.py --hidden 100 --data ../shared/datasets
    python benchmarks/posch_pilz.py --hidden 100 --iterations 300 --limit 2000 --test-limit 500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

import zoo
from zoo import metrics
from zoo.training.options import grouped

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # loaded by path (notebook 03)
import suite  # noqa: E402

ITERATIONS = 100_000
KL_DOWN_WEIGHT = 100.0  # nu = 1 / (N * 100): the paper's per-example KL, down-weighted
KAPPA = 50.0  # learning-rate multiplier of the correlation parameters (gamma)
LAYERS = ("conv1", "conv2", "fc1", "fc2")

# The paper's Tables I-III (MNIST, LeNet-5, 100 / 250 units in the first FC layer).
PAPER = {
    100: {
        "test_error": {"bayesian": 0.0070, "frequentist": 0.0084},
        "tau_rho": {  # weights tau, rho; biases tau, rho
            "conv1": (0.04, -0.44, 0.05, -0.04),
            "conv2": (0.52, -0.25, 0.05, -0.01),
            "fc1": (0.86, -0.15, 0.05, 0.01),
            "fc2": (0.05, -0.21, 0.04, 0.01),
        },
        "certainty": {
            "certain_correct": 9668,
            "uncertain_correct": 262,
            "certain_wrong": 14,
            "uncertain_wrong": 56,
        },
    },
    250: {
        "test_error": {"bayesian": 0.0061, "frequentist": 0.0070},
        "tau_rho": {  # the paper's Table II labels these rows "200" neurons; its text says 250
            "conv1": (0.03, -0.44, 0.05, 0.03),
            "conv2": (0.35, -0.21, 0.05, -0.01),
            "fc1": (2.02, -0.15, 0.06, -0.01),
            "fc2": (0.06, -0.18, 0.05, 0.01),
        },
        "certainty": {
            "certain_correct": 9587,
            "uncertain_correct": 352,
            "certain_wrong": 8,
            "uncertain_wrong": 53,
        },
    },
}


def recipe(family: str) -> dict:
    """The paper's optimisation settings as ``zoo.fit`` options (the README's recipe call)."""
    options = dict(
        batch_size=64,
        optimizer="sgd",
        lr=0.01,
        optimizer_options={"momentum": 0.9},
        lr_schedule=paper_schedule,
        per_example=True,  # the paper's loss is per example: -ELBO / N
        kl_weight=1 / KL_DOWN_WEIGHT,
    )
    if family == "tridiagonal":
        options["lr_multipliers"] = {"*.gamma*": KAPPA}
    return options


def paper_schedule(i: int) -> float:
    """The paper's learning-rate factor ``(1 + 1e-4 i)^-0.75``."""
    return (1 + 1e-4 * i) ** -0.75


def tau_rho(guide) -> dict[str, dict[str, float]]:
    """Table II: each layer's learned ``tau`` and ``rho`` (weights and biases), tridiagonal
    ``"posch"`` guides only."""
    table = {}
    for layer in LAYERS:
        w = guide.site_posterior(f"{layer}.weight")
        b = guide.site_posterior(f"{layer}.bias")
        table[layer] = {
            "tau": w.tau.item(),
            "rho": w.rho.item(),
            "tau_bias": b.tau.item(),
            "rho_bias": b.rho.item(),
        }
    return table


def examples(pred, labels: torch.Tensor) -> dict[str, list[int]]:
    """Test images for the paper's figures 3-5: the most confident correct prediction (lowest
    entropy) and the two misclassified images the sampled networks disagree on most (largest
    mutual information)."""
    correct = pred.probs.argmax(-1) == labels
    right = torch.nonzero(correct).squeeze(-1)
    wrong = torch.nonzero(~correct).squeeze(-1)
    confident = right[pred.entropy[right].argmin()] if len(right) else None
    worst = wrong[pred.mutual_information[wrong].argsort(descending=True)[:2]]
    return {
        "confident_correct": [] if confident is None else [int(confident)],
        "wrong_most_uncertain": [int(i) for i in worst],
    }


def evaluate(fit, test, samples: int, seed: int) -> dict:
    """Test error, NLL, ECE, the certainty table and the figure examples on ``test``."""
    x, y = test.tensors
    start = time.perf_counter()
    pred = fit.predict(x, num_samples=samples, progress=False, seed=seed)
    seconds = time.perf_counter() - start
    y = y.to(pred.probs.device)  # the predictions stay on the model's device
    return {
        "test_error": 1 - metrics.accuracy(pred.probs, y),
        "nll": metrics.nll(pred.probs, y),
        "ece": metrics.ece(pred.probs, y),
        "certainty": metrics.certainty_table(pred.sample_probs, y),
        "examples": examples(pred, y),
        "eval_seconds": seconds,
    }


def loss_curve(losses: list[float], points: int = 100) -> dict[str, list[float]]:
    """The per-step losses ``zoo.fit`` reports (``-ELBO`` on the full-data scale, the KL term
    weighted by ``1 / KL_DOWN_WEIGHT``; ``per_example`` only scales the gradients) averaged over
    ``points`` equal windows of steps."""
    if not losses:
        return {"step": [], "loss": []}
    t = torch.tensor(losses, dtype=torch.float64)
    width = max(1, len(t) // points)
    n = len(t) // width * width
    return {
        "step": [float(i * width + width) for i in range(n // width)],
        "loss": t[:n].reshape(-1, width).mean(1).tolist(),
    }


def machine(device: torch.device) -> dict:
    """What ran the fit, for the JSON."""
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"device": str(device), "name": name, "load_average": load, "torch": torch.__version__}


def run(args: argparse.Namespace) -> dict:
    """Fit (or resume), save, evaluate; returns the results written to the JSON."""
    name = f"{args.family}_{args.hidden}"
    out, ckpt_dir = Path(args.out), Path(args.checkpoints)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = ckpt_dir / f"{name}.ckpt"
    train = zoo.data.mnist(args.data, limit=args.limit)
    test = zoo.data.mnist(args.data, train=False, limit=args.test_limit)
    fit = zoo.fit(
        zoo.models.LeNet5(hidden=args.hidden),
        args.family,
        train,
        num_steps=args.iterations,
        seed=args.seed,
        engine=zoo.Engine(
            device=args.device,
            threads=args.threads if args.threads == "auto" else int(args.threads),
            cuda_graph={"auto": "auto", "true": True, "false": False}[args.cuda_graph],
        ),
        run=zoo.Run(
            progress=args.progress,
            checkpoint=checkpoint,
            checkpoint_every=args.checkpoint_every,
            resume=checkpoint if checkpoint.exists() else None,
        ),
        **grouped(recipe(args.family)),
    )
    if fit.interrupted:
        raise SystemExit(f"interrupted at step {fit.steps}; run the same command to resume")
    fit.save(out / f"{name}.fit")
    results = {
        "command": args.command,
        "family": args.family,
        "hidden": args.hidden,
        "iterations": fit.steps,
        "train_size": len(train),
        "test_size": len(test),
        "samples": args.samples,
        "seed": args.seed,
        "fit_seconds": fit.wall_time,
        "machine": machine(fit.device),
        "date": time.strftime("%Y-%m-%d"),
        **evaluate(fit, test, args.samples, args.seed),
        "tau_rho": tau_rho(fit.guide) if args.family == "tridiagonal" else None,
        "loss_curve": loss_curve(fit.losses),
        "paper": PAPER.get(args.hidden),
    }
    suite.write_json(results, out / f"{name}.json")
    return results


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=100, help="units in the first FC layer")
    parser.add_argument("--family", default="tridiagonal", choices=("tridiagonal", "diagonal"))
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    parser.add_argument("--limit", type=int, default=None, help="training images (default all)")
    parser.add_argument("--test-limit", type=int, default=None, help="test images (default all)")
    parser.add_argument("--samples", type=int, default=200, help="sampled networks per image")
    parser.add_argument("--data", default=None, help="MNIST root (default: $ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/posch_pilz")
    parser.add_argument("--checkpoints", default="runs/posch_pilz")
    parser.add_argument("--checkpoint-every", type=int, default=1000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", default="auto", help='intra-op CPU threads or "auto"')
    parser.add_argument(
        "--cuda-graph",
        default="auto",
        choices=["auto", "true", "false"],
        help="replay each step from a CUDA graph: auto (the default: on CUDA whenever the fit "
        "allows it), true or false",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.command = "python benchmarks/posch_pilz.py " + shlex.join(given)
    return args


def _row(label: str, r: dict, fitted: bool = True) -> list:
    table = r["certainty"]
    error = r["test_error"] if fitted else r["test_error"]["bayesian"]
    return [
        label,
        f"{100 * error:.2f}%",
        f"{r['nll']:.4f}" if fitted else "",
        f"{r['ece']:.4f}" if fitted else "",
        f"{table['certain_correct']} / {table['uncertain_correct']}",
        f"{table['certain_wrong']} / {table['uncertain_wrong']}",
        f"{r['fit_seconds']:.0f}" if fitted else "",
    ]


def report(runs: list[dict]) -> list[str]:
    """Each run in ``runs`` (a run's saved results) beside the paper's row of its width, then
    the learned ``tau`` / ``rho`` per layer against the paper's Table II, and each run's
    command."""
    rows, shown = [], set()
    for r in sorted(runs, key=lambda r: (r["hidden"], r["family"] != "tridiagonal")):
        rows.append(_row(f"zoo, {r['family']}, {r['hidden']} units", r))
        if r.get("paper") and r["hidden"] not in shown:
            shown.add(r["hidden"])
            rows.append(_row(f"paper, Bayesian, {r['hidden']} units", r["paper"], fitted=False))
    columns = ["run", "test error", "NLL", "ECE", "correct: certain / uncertain",
               "wrong: certain / uncertain", "fit s"]  # fmt: skip
    lines = suite.markdown(columns, rows, ["---"] * len(columns))
    for r in runs:
        if r.get("tau_rho"):
            paper = (r.get("paper") or {}).get("tau_rho", {})
            cells = []
            for layer, v in r["tau_rho"].items():
                ref = paper.get(layer)
                cells.append(f"{layer} {v['tau']:.3f} / {v['rho']:.3f}"
                             + (f" ({ref[0]} / {ref[1]})" if ref else ""))  # fmt: skip
            lines += ["", f"Learned tau / rho of the weights, {r['family']} {r['hidden']} units "
                      "(the paper's Table II in brackets): " + ", ".join(cells) + "."]  # fmt: skip
    lines += ["", "Runs: " + "; ".join(f"`{r['command']}` ({r['iterations']:,} iterations, "
                                      f"{r['test_size']:,} test images x {r['samples']} draws)"
                                      for r in runs) + "."]  # fmt: skip
    return lines


def main() -> None:
    args = parse()
    run(args)
    out = Path(args.out)
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    lines = report(runs)  # every run the folder holds: one family and width per command
    print("\n".join(lines))
    suite.save("posch_pilz", lines, None, out.parent / f"{out.name}.json")


if __name__ == "__main__":
    main()
