"""Where a learned noise's size comes from: the training residual plus the function's spread.

    python benchmarks/regression_noise.py                    # diabetes, diagonal, default prior
    python benchmarks/regression_noise.py --prior fixed --splits 0 1 2

For the Gaussian likelihood the expected log-likelihood is
``-N log sigma - sum_i E_q[(y_i - f(x_i))^2] / (2 sigma^2)``, so the noise that maximises the
ELBO (up to its prior) has ``sigma^2 = mean_i (y_i - E_q f(x_i))^2 + mean_i Var_q f(x_i)``: the
training residual of the posterior mean *plus* the posterior's spread of the function on the
training points. The predictive variance at a test point is ``sigma^2 + Var_q f(x)``, which
counts that spread a second time. This script fits ``benchmarks/regression.py``'s diabetes
model (its splits, standardisation and ``zoo.REGRESSION_FIT``) and prints, per split, the
fitted ``E_q[sigma^2]`` beside the two terms (standardised units), and the spread on the test
points; plain least squares' residual variance on the same split is the reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import regression  # noqa: E402  (the benchmark's data, splits and priors)


def least_squares_variance(x: torch.Tensor, y: torch.Tensor) -> float:
    """The unbiased residual variance of an ordinary least-squares fit with an intercept."""
    design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    beta = torch.linalg.lstsq(design, y.double().unsqueeze(-1)).solution
    residual = y.double().unsqueeze(-1) - design @ beta
    return float(residual.pow(2).sum() / (len(x) - design.shape[1]))


def decompose(split: int, prior: str, family: str, samples: int, num_steps: int | None) -> dict:
    """Fit one split and return the noise's two terms (standardised units)."""
    import zoo
    from zoo.training.options import grouped

    x, y = regression.load("diabetes")
    (xtr, ytr), (xte, _), _, _ = regression.split(x, y, split)
    prior_arg = regression.prior_value(prior)
    model = zoo.models.BayesianMLP(
        xtr.shape[1], [50], 1, task="regression", noise="learned", prior=prior_arg
    )
    recipe = dict(zoo.REGRESSION_FIT)
    if num_steps is not None:
        recipe["num_steps"] = num_steps
    start = time.perf_counter()
    fit = zoo.fit(
        model,
        family,
        (xtr, ytr),
        batch_size=len(xtr),
        seed=split,
        **grouped({"progress": False, **recipe}),
    )
    seconds = time.perf_counter() - start
    train = fit.predict(xtr, num_samples=samples, seed=0, progress=False)
    test = fit.predict(xte, num_samples=samples, seed=0, progress=False)
    return {
        "split": split,
        "noise_var": float(train.sample_scales.pow(2).mean()),
        "residual": float((ytr - train.sample_means.mean(0)).pow(2).mean()),
        "spread_train": float(train.sample_means.var(0).mean()),
        "spread_test": float(test.sample_means.var(0).mean()),
        "least_squares": least_squares_variance(xtr, ytr),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prior", default="default", choices=regression.PRIORS)
    parser.add_argument("--family", default="diagonal")
    parser.add_argument("--splits", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--samples", type=int, default=500, help="networks drawn per point")
    parser.add_argument("--num-steps", type=int, default=None, help="default: REGRESSION_FIT")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average); {args.family}, prior {args.prior}")
    print(
        "| split | E_q[sigma^2] | train residual | train spread Var_q f | residual + spread "
        "| test spread | least squares' residual variance |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for split in args.splits:
        r = decompose(split, args.prior, args.family, args.samples, args.num_steps)
        rows.append(r)
        print(
            f"| {split} | {r['noise_var']:.3f} | {r['residual']:.3f} | {r['spread_train']:.3f} "
            f"| {r['residual'] + r['spread_train']:.3f} | {r['spread_test']:.3f} "
            f"| {r['least_squares']:.3f} |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
