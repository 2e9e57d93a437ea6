"""Command line: ``python -m zoo demo`` (and the ``zoo`` console script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def demo(args: argparse.Namespace) -> int:
    """Fit the 1D regression toy with the diagonal guide, print metrics, write the band plot."""
    import torch

    import zoo
    from zoo import plots

    x, y = zoo.data.toy_regression(n=args.points, seed=args.seed)
    model = zoo.models.BayesianMLP(1, hidden=(50, 50), task="regression", noise="learned")
    fit = zoo.fit(
        model,
        args.guide,
        (x, y),
        num_steps=args.steps,
        batch_size=len(x),
        lr=args.lr,
        seed=args.seed,
        guide_options={"init_scale": 1e-3},
        progress=not args.quiet,
    )
    x_test, y_test = zoo.data.toy_regression(n=500, seed=args.seed + 1)
    metrics = fit.evaluate((x_test, y_test), num_samples=200)
    grid = torch.linspace(-5, 5, 400).unsqueeze(-1)
    pred = fit.predict(grid, num_samples=200)
    gap = pred.epistemic_variance[(grid.squeeze(-1).abs() < 0.3)].mean().sqrt().item()
    seen = pred.epistemic_variance[((grid.squeeze(-1).abs() - 2).abs() < 0.5)].mean().sqrt().item()
    print(f"guide: {args.guide}   steps: {fit.steps}   time: {fit.wall_time:.1f} s")
    print(f"final loss (-ELBO): {fit.losses[-1]:.2f}")
    for key, value in metrics.items():
        print(f"test {key}: {value:.4f}")
    print(f"epistemic sd on the data: {seen:.3f}   in the gap around 0: {gap:.3f}")
    fig = plots.regression_band(
        x, y, grid, pred, truth=zoo.data.toy_function(grid), title=f"{args.guide} guide"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import guides

    parser = argparse.ArgumentParser(prog="zoo", description="Bayesian neural network model zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "demo",
        help="fit the 1D regression toy and plot its predictive band",
        description="Fit a Bayesian MLP to the two-interval 1D toy, print test metrics and "
        "write a PNG of the predictive mean with its credible band.",
    )
    p.add_argument("--guide", default="diagonal", choices=guides.available(), help="family")
    p.add_argument("--steps", type=int, default=3000, help="optimiser steps (full batch)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    p.add_argument("--points", type=int, default=160, help="training points")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", default="zoo-demo.png", help="where to write the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.func(args)
