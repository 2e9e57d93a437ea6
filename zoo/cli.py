"""Command line: ``python -m zoo demo`` (and the ``zoo`` console script)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from zoo.cli_values import family_options, guide_options, noise_value, prior_value


def demo(args: argparse.Namespace) -> int:
    """Fit the 1D regression toy with the diagonal guide, print metrics, write the band plot."""
    import torch

    import zoo
    from zoo import plots

    x, y = zoo.data.toy_regression(n=args.points, seed=args.seed)
    model = zoo.models.BayesianMLP(
        1, hidden=(50, 50), task="regression", noise=args.noise, prior=args.prior
    )
    fit = zoo.fit(
        model,
        args.guide,
        (x, y),
        num_steps=args.steps,
        batch_size=len(x),
        lr=args.lr,
        lr_schedule=zoo.REGRESSION_FIT["lr_schedule"],  # a tenfold decay over the run
        seed=args.seed,
        guide_options={"init_scale": 1e-3},
        progress=not args.quiet,
    )
    x_test, y_test = zoo.data.toy_regression(n=500, seed=args.seed + 1)
    metrics = fit.evaluate((x_test, y_test), num_samples=200, progress=not args.quiet)
    grid = torch.linspace(-5, 5, 400).unsqueeze(-1)
    pred = fit.predict(grid, num_samples=200, progress=not args.quiet, seed=args.seed)
    xs, sd = grid.squeeze(-1), pred.epistemic_variance.sqrt()
    seen = sd[((xs.abs() - 2).abs() < 0.9)].mean().item()  # the data lie in 1 <= |x| <= 3
    gap, beyond = sd[xs.abs() < 0.5].mean().item(), sd[xs.abs() > 4].mean().item()
    print(f"guide: {args.guide}   prior: {model.prior!r}")
    print(f"steps: {fit.steps}   time: {fit.wall_time:.1f} s")
    print(f"final loss (-ELBO): {fit.losses[-1]:.2f}")
    for key, value in metrics.items():
        label = {"nll": "nll (negative log predictive density per point; can be < 0)"}
        print(f"test {label.get(key, key)}: {value:.4f}")
    print(
        f"epistemic sd on the data: {seen:.3f}   in the gap |x| < 0.5: {gap:.3f}   "
        f"beyond |x| > 4: {beyond:.3f}"
    )
    fig = plots.regression_band(
        x, y, grid, pred, truth=zoo.data.toy_function(grid), title=f"{args.guide} guide"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


_DATASETS = ("mnist", "fashion_mnist", "cifar10", "toy")
_MODELS = ("mlp", "lenet5", "cifarnet")


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as usage errors, what would otherwise fail later: family options a family does
    not take, a CUDA device on a machine without one, a model that cannot take the data."""
    import torch

    import guides
    from guides.base import check_family_options

    if args.command == "demo":
        return
    try:
        if args.command == "fit":
            args.options = {args.guide: guide_options(args.guide_option)}
        else:
            args.options = family_options(args.guide_option, args.guides)
        for family, options in args.options.items():
            cls = guides.get(family)
            check_family_options(cls, *cls.site_spec(**options))
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device; use cpu or auto")
    images = {"mnist": "lenet5", "fashion_mnist": "lenet5", "cifar10": "cifarnet", "toy": "mlp"}
    if args.model is None:
        args.model = images[args.data]
    fits = {"lenet5": ("mnist", "fashion_mnist"), "cifarnet": ("cifar10",)}
    if args.data == "toy" and args.model != "mlp":
        parser.error(f"--data toy (1-D regression) needs --model mlp, not {args.model}")
    if args.model in fits and args.data not in fits[args.model]:
        parser.error(f"--model {args.model} takes {' or '.join(fits[args.model])} images")


def _load_data(args):
    import zoo

    if args.data == "toy":
        return zoo.data.toy_regression(n=200, seed=args.seed), zoo.data.toy_regression(
            n=500, seed=args.seed + 1
        )
    loader = getattr(zoo.data, args.data)
    train = loader(args.root, train=True, limit=args.limit)
    test = loader(args.root, train=False, limit=args.test_limit)
    return train, test


def _model_factory(args, train):
    import zoo
    from zoo.data_checks import as_tensors

    x, _ = as_tensors(train)
    if args.data == "toy":
        return lambda: zoo.models.BayesianMLP(1, args.hidden, 1, noise=args.noise)
    if args.model == "lenet5":
        if tuple(x.shape[1:]) != (1, 28, 28):
            raise SystemExit("--model lenet5 needs 1x28x28 images (mnist, fashion_mnist)")
        return lambda: zoo.models.LeNet5(hidden=args.hidden[0] if args.hidden else 100)
    if args.model == "cifarnet":
        if tuple(x.shape[1:]) != (3, 32, 32):
            raise SystemExit("--model cifarnet needs 3x32x32 images (cifar10)")
        return zoo.models.CifarNet
    features = math.prod(x.shape[1:])

    def make():
        return zoo.models.BayesianMLP(
            features, args.hidden, 10, task="classification", input_shape=tuple(x.shape[1:])
        )

    return make


def _fit_options(args) -> dict:
    return dict(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        num_particles=args.num_particles,
        kl_weight=args.kl_weight,
        elbo=args.elbo,
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
    )


def fit_command(args: argparse.Namespace) -> int:
    """Fit one model and family, print test metrics, save the fit and an ArviZ netCDF."""
    import zoo
    from zoo.arviz import to_netcdf
    from zoo.data_checks import gather_tensors
    from zoo.distributed import process_rank

    train, test = _load_data(args)
    model = _model_factory(args, train)()
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    fit = zoo.fit(
        model,
        args.guide,
        train,
        guide_options=args.options[args.guide],
        devices=devices,
        num_nodes=args.num_nodes,
        strategy=args.strategy,
        accelerator=args.accelerator,
        **_fit_options(args),
    )
    shared = dict(progress=not args.quiet, distributed=fit.options["world_size"] > 1)
    metrics = fit.evaluate(test, num_samples=args.samples, **shared)
    x, y = gather_tensors(test)  # any data form, as tensors
    n = min(len(x), args.arviz_points)
    idata = fit.to_arviz((x[:n], y[:n]), num_samples=args.arviz_samples, **shared)
    if process_rank() != 0:  # every rank computed its part; rank 0 writes and prints
        return 0
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.model}-{args.guide}-{args.data}"
    saved = fit.save(out / f"{stem}.pt")
    netcdf = to_netcdf(idata, out / f"{stem}.nc")
    print(f"| metric | {args.guide} |\n| --- | --- |")
    print(f"| steps | {fit.steps} |\n| fit seconds | {fit.wall_time:.1f} |")
    last = fit.epoch_losses[-1] if fit.epoch_losses else fit.losses[-1]
    print(f"| final -ELBO (mean of the last epoch) | {last:.2f} |")
    for key, value in metrics.items():
        print(f"| {key} | {value:.4f} |")
    print(f"saved the fit to {saved} and ArviZ data to {netcdf}")
    return 0


def compare_command(args: argparse.Namespace) -> int:
    """Fit several families on the same data; print the table, save it and a chart."""
    import zoo

    train, test = _load_data(args)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"compare-{args.model}-{args.data}"
    table = zoo.compare(
        _model_factory(args, train),
        [(f, f, args.options[f]) for f in args.guides],
        train,
        test,
        num_samples=args.samples,
        chart=out / f"{stem}.png",
        **_fit_options(args),
    )
    print(table.to_markdown() if _has_tabulate() else table.to_string())
    table.to_csv(out / f"{stem}.csv")
    print(f"saved {out / (stem + '.csv')} and {out / (stem + '.png')}")
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


def _add_training_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        choices=_MODELS,
        help="network (default: lenet5 for mnist and fashion_mnist, cifarnet for cifar10, mlp "
        "for toy)",
    )
    p.add_argument(
        "--hidden",
        type=int,
        nargs="*",
        default=[100],
        help="hidden widths: MLP layers, or LeNet-5's FC width",
    )
    p.add_argument("--data", default="mnist", choices=_DATASETS, help="data set")
    p.add_argument(
        "--root", default=None, help="data root (None: $ZOO_DATA, else ~/.cache/bnn-zoo/data)"
    )
    p.add_argument("--limit", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--test-limit", type=int, default=None, help="only the first N test examples")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=128, help="minibatch size")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--num-particles", type=int, default=1, help="ELBO samples per step")
    p.add_argument("--kl-weight", type=float, default=1.0, help="factor on the KL term")
    p.add_argument(
        "--elbo",
        default="trace",
        choices=("trace", "meanfield"),
        help="Monte Carlo KL (trace) or closed-form KL (meanfield)",
    )
    p.add_argument("--samples", type=int, default=100, help="posterior samples per test input")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--out-dir", default="runs", help="where to write results")
    p.add_argument(
        "--noise",
        type=noise_value,
        default=0.1,
        help="--data toy: observation noise sd (the toy's own is 0.1), 'learned' or "
        "'heteroscedastic'",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    import guides
    from zoo.training import REGRESSION_FIT

    parser = argparse.ArgumentParser(prog="zoo", description="Bayesian neural network model zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    formatter = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser(
        "demo",
        formatter_class=formatter,
        help="fit the 1D regression toy and plot its predictive band",
        description="Fit a Bayesian MLP to the two-interval 1D toy, print test metrics and "
        "write a PNG of the predictive mean with its credible band.",
    )
    p.add_argument("--guide", default="diagonal", choices=guides.available(), help="family")
    p.add_argument(
        "--steps",
        type=int,
        default=REGRESSION_FIT["num_steps"],
        help="optimiser steps (full batch)",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=REGRESSION_FIT["lr"],
        help="Adam learning rate, decayed tenfold over the run",
    )
    p.add_argument("--points", type=int, default=160, help="training points")
    p.add_argument(
        "--noise",
        type=noise_value,
        default=0.1,
        help="observation noise sd: a number (the toy's own is 0.1), 'learned' (a "
        "latent site; the ELBO then prefers a wider noise and a flatter, underfitted curve) or "
        "'heteroscedastic' (the network predicts it per input)",
    )
    p.add_argument(
        "--prior",
        type=prior_value,
        default=None,
        help="weight prior: default (the model's own, N(0, 1)), learned, "
        "hierarchical, normal:S (N(0, S^2) on every weight) or layerwise:G (N(0, G^2 / fan_in))",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", default="zoo-demo.png", help="where to write the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=demo)

    f = sub.add_parser(
        "fit",
        formatter_class=formatter,
        help="fit one model with one posterior family and evaluate it",
        description="Fit a Bayesian network with one posterior family, print the test "
        "metrics, save the fit (zoo.load) and an ArviZ netCDF of the posterior and predictive.",
    )
    _add_training_options(f)
    f.add_argument("--guide", default="diagonal", choices=guides.available(), help="family")
    f.add_argument(
        "--guide-option",
        action="append",
        metavar="KEY=VALUE",
        help="family option, repeatable: rank=5, parameterization=free, ...",
    )
    f.add_argument("--arviz-samples", type=int, default=100, help="draws in the netCDF")
    f.add_argument(
        "--arviz-points",
        type=int,
        default=1000,
        help="test points in the netCDF's predictive groups",
    )
    g = f.add_argument_group("across processes (Lightning; needs the distributed extra)")
    g.add_argument("--devices", default="1", help="devices per node: a count, or 'auto'")
    g.add_argument("--num-nodes", type=int, default=1, help="machines")
    g.add_argument("--strategy", default="auto", help="ddp, ddp_spawn, ... (as Lightning's)")
    g.add_argument("--accelerator", default="auto", help="cpu, gpu or auto")
    f.set_defaults(func=fit_command)

    c = sub.add_parser(
        "compare",
        formatter_class=formatter,
        help="fit several families on the same data and tabulate them",
        description="Fit each family with the same data, seed and options; print a table of "
        "parameters, speed, final ELBO and test metrics; save it as CSV with a chart.",
    )
    _add_training_options(c)
    c.add_argument(
        "--guides",
        nargs="+",
        default=list(guides.available()),
        choices=guides.available(),
        help="families to compare (every registered family)",
    )
    c.add_argument(
        "--guide-option",
        action="append",
        metavar="FAMILY.KEY=VALUE",
        help="an option of one family, repeatable: lowrank.rank=5, "
        "tridiagonal.parameterization=free",
    )
    c.set_defaults(func=compare_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    _check_arguments(parser, args)
    return args.func(args)
