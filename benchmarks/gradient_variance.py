"""Gradient variance of the ELBO under each estimator: reparameterisation, local
reparameterisation and Flipout.

    python benchmarks/gradient_variance.py --data ../shared/datasets
    python benchmarks/gradient_variance.py --data ../shared/datasets --family matrix_normal

An MLP 784-400-400-10 is first fitted on MNIST for ``--warmup`` steps (diagonal family, plain
reparameterisation), so the posterior variances are those of a network in training, not of the
initialisation. Then, with the parameters fixed and one minibatch of ``--batch-size`` images,
``--draws`` gradients of the minibatch -ELBO estimate are taken per estimator. The table gives,
per parameter group (means, scale parameters), the variance of each gradient element across
draws averaged over the elements, as a ratio to plain reparameterisation, and the mean
step time.
"""

from __future__ import annotations

import argparse
import time

import pyro
import torch

import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="data root (default: $ZOO_DATA)")
    parser.add_argument("--family", default="diagonal", choices=("diagonal", "matrix_normal"))
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--elbo", default="trace", choices=("trace", "meanfield"))
    args = parser.parse_args()

    train = zoo.data.mnist(args.data, train=True)
    x_all, y_all = train.tensors
    x_all = x_all.reshape(len(x_all), -1)
    model = zoo.models.BayesianMLP(784, (400, 400), 10, task="classification")
    fit = zoo.fit(
        model,
        args.family,
        (x_all, y_all),
        num_steps=args.warmup,
        run=zoo.Run(progress=False),
        seed=0,
    )
    guide = fit.guide
    x, y = x_all[: args.batch_size], y_all[: args.batch_size]
    names = [n for n, _ in guide.named_parameters()]
    params = [p for _, p in guide.named_parameters()]
    estimators = ["reparam", "local"] + (["flipout"] if args.family == "diagonal" else [])
    stats = {}
    for estimator in estimators:
        objective = zoo.Objective(model, guide, elbo=args.elbo, estimator=estimator)
        objective.setup(x, y)
        pyro.set_rng_seed(1)
        grads, times = [], []
        for _ in range(args.draws):
            start = time.perf_counter()
            loss = objective.loss(x, y, num_data=len(x_all))
            grads.append([g.detach() for g in torch.autograd.grad(loss, params)])
            times.append(time.perf_counter() - start)
        variance = {}
        for i, name in enumerate(names):
            if not name.endswith(
                (
                    ".weight.loc_unconstrained",
                    ".weight.rho_unconstrained",
                    ".weight.row_raw_unconstrained",
                    ".weight.col_raw_unconstrained",
                )
            ):
                continue
            stack = torch.stack([g[i] for g in grads])
            kind = "mean" if "loc" in name else "scale"
            variance.setdefault(kind, []).append(stack.var(0).mean().item())
        stats[estimator] = (
            {k: sum(v) / len(v) for k, v in variance.items()},
            sorted(times)[len(times) // 2],
        )
    base = stats["reparam"][0]
    print(
        f"\nMLP 784-400-400-10, {args.family}, MNIST after {args.warmup} steps, batch "
        f"{args.batch_size}, {args.draws} gradients per estimator, elbo={args.elbo}; variance of "
        "the weight-parameter gradients (mean over elements and layers), relative to reparam\n"
    )
    print("| estimator | var(grad means) | var(grad scales) | ms / gradient |")
    print("| --- | ---: | ---: | ---: |")
    for estimator, (var, t) in stats.items():
        ratio_mean, ratio_scale = var["mean"] / base["mean"], var["scale"] / base["scale"]
        print(f"| {estimator} | {ratio_mean:.3f} | {ratio_scale:.3f} | {1e3 * t:.1f} |")


if __name__ == "__main__":
    main()
