"""Command line: ``python -m zoo demo`` (and the ``zoo`` console script)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import guides
import zoo
from zoo.cli.info import info_command
from zoo.cli.parser import (
    SEQUENCE_MODELS,
    TOY_GUIDE_OPTIONS,
    TOY_HIDDEN,
    TOY_POINTS,
    TOY_TEST_POINTS,
    baselines,
    check_arguments,
    from_flags,
)
from zoo.cli.parser import build_parser as _build_parser
from zoo.data.forms import gather_tensors
from zoo.runtime.distributed import process_rank
from zoo.runtime.packages import BrokenTorchvisionError
from zoo.training.options import GROUPS


def demo(args: argparse.Namespace) -> int:
    """Fit the 1D regression toy with the diagonal guide, print metrics, write the band plot."""

    from zoo.evaluation import plots

    x, y = zoo.data.toy_regression(n=args.points, seed=args.seed)
    model = zoo.models.BayesianMLP(
        1, hidden=TOY_HIDDEN, task="regression", noise=args.noise, prior=args.prior
    )

    fit = zoo.fit(
        model,
        guides.family(args.guide, **TOY_GUIDE_OPTIONS),
        (x, y),
        num_steps=args.steps,
        batch_size=len(x),
        lr=args.lr,
        seed=args.seed,
        optim=zoo.Optim(lr_schedule=zoo.REGRESSION_FIT["lr_schedule"]),  # tenfold decay
        run=zoo.Run(progress=not args.quiet),
    )
    x_test, y_test = zoo.data.toy_regression(n=TOY_TEST_POINTS, seed=args.seed + 1)
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


def _load_data(args):

    if args.data == "toy":
        return zoo.data.toy_regression(n=TOY_POINTS, seed=args.seed), zoo.data.toy_regression(
            n=TOY_TEST_POINTS, seed=args.seed + 1
        )

    loader = getattr(zoo.data, args.data)
    layout = {"layout": "sequence"} if args.model in SEQUENCE_MODELS else {}
    train = loader(args.root, train=True, limit=args.limit, **layout)
    test = loader(args.root, train=False, limit=args.test_limit, **layout)
    return train, test


def _model_factory(args, train):

    x, _ = gather_tensors(train)
    hidden: Sequence[int] = (
        args.hidden if args.hidden is not None else TOY_HIDDEN if args.data == "toy" else [100]
    )
    if args.data == "toy":
        return lambda: zoo.models.BayesianMLP(1, hidden, 1, noise=args.noise)
    if args.model == "lenet5":
        if tuple(x.shape[1:]) != (1, 28, 28):
            raise SystemExit("--model lenet5 needs 1x28x28 images (mnist, fashion_mnist)")
        return lambda: zoo.models.LeNet5(hidden=hidden[0] if hidden else 100)
    if args.model == "cifarnet":
        if tuple(x.shape[1:]) != (3, 32, 32):
            raise SystemExit("--model cifarnet needs 3x32x32 images (cifar10)")
        return zoo.models.CifarNet
    channels, size = x.shape[1], x.shape[-1]
    if args.model == "resnet20":
        return lambda: zoo.models.ResNet(20, in_channels=channels, input_size=size)
    if args.model == "alexnet":
        return lambda: zoo.models.AlexNet(channels, size=size)
    if args.model == "transformer":
        return lambda: zoo.models.TransformerClassifier(in_features=size, seq_len=x.shape[1])
    if args.model == "lstm":
        width = hidden[0] if args.hidden else 64
        return lambda: zoo.models.RecurrentClassifier(size, hidden=width, seq_len=x.shape[1])
    features = math.prod(x.shape[1:])

    def make():
        return zoo.models.BayesianMLP(
            features, hidden, 10, task="classification", input_shape=tuple(x.shape[1:])
        )

    return make


def _guide_options(args, family: str) -> dict:
    """The family options given on the command line, over the toy's recipe for ``--data toy``
    (a guide's initial scale: not the baselines', which have no guide of their own)."""

    base = TOY_GUIDE_OPTIONS if args.data == "toy" and family not in baselines() else {}
    return {**base, **args.options[family]}


def _fit_options(args) -> dict:
    """``zoo.fit``'s arguments from the flags: its own (unset ones, None, leave ``fit`` its
    defaults) and every option group, built from the flags the group declared
    (:func:`zoo.cli.parser.from_flags`)."""

    own = dict(
        epochs=args.epochs,
        num_steps=args.num_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    return {**own, **{name: from_flags(cls, args) for name, cls in GROUPS.items()}}


def fit_command(args: argparse.Namespace) -> int:
    """Fit one model and family, print test metrics, save the fit and an ArviZ netCDF."""
    from zoo.evaluation.arviz import to_netcdf

    train, test = _load_data(args)
    model = _model_factory(args, train)()

    fit = zoo.fit(
        model, guides.family(args.guide, **_guide_options(args, args.guide)), train,
        **_fit_options(args),
    )  # fmt: skip
    shared = dict(progress=args.progress, distributed=fit.options["world_size"] > 1)
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

    train, test = _load_data(args)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"compare-{args.model}-{args.data}"
    table = zoo.compare(
        _model_factory(args, train),
        [(f, f, _guide_options(args, f)) for f in args.guides],
        train,
        test,
        num_samples=args.samples,
        chart=out / f"{stem}.png",
        progress=args.progress,
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


def build_parser():
    """The ``zoo`` command's parser (:mod:`zoo.cli.parser`) wired to this module's commands."""

    return _build_parser(
        {"demo": demo, "fit": fit_command, "compare": compare_command, "info": info_command}
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    check_arguments(args.parser, args)
    command: argparse.ArgumentParser = args.parser  # the command's own, for its usage line
    try:
        return args.func(args)
    except (
        FileNotFoundError,  # a data set that is not on disk and cannot be downloaded
        BrokenTorchvisionError,  # torchvision missing or built for another torch
        ValueError,  # the library's refusals (a resume of another fit, a bad file)
    ) as err:
        command.error(str(err))
