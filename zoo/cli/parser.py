"""The command line's parser: its subcommands, flags, defaults and the usage checks that run
before any data is read. The commands themselves live in :mod:`zoo.cli.commands`."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable

import torch

import guides
import zoo
from guides.checks import check_family_options
from zoo.baselines.producers import PRODUCERS
from zoo.cli.values import (
    family_options,
    guide_options,
    noise_value,
    prior_value,
    steps_value,
)
from zoo.comparison import check_row
from zoo.results import laplace_torch
from zoo.runtime.distributed import STRATEGIES
from zoo.training.option_values import positive_float, positive_int, rate_value
from zoo.training.options import GROUPS
from zoo.training.recipes import REGRESSION_FIT

#: The 1-D toy's recipe, shared by ``demo``, ``fit --data toy`` and ``compare --data toy``: 160
#: training points, 500 test points, full batch (``zoo.fit``'s small-data recipe,
#: ``zoo.REGRESSION_FIT``: 3,000 Adam steps at 1e-2 decaying tenfold) and small initial
#: posterior scales (``init_scale`` 1e-3: the diagonal's band on the data starts narrow).
TOY_POINTS = 160
TOY_HIDDEN = (50, 50)
TOY_TEST_POINTS = 500
TOY_GUIDE_OPTIONS = {"init_scale": 1e-3}


_DATASETS = ("mnist", "fashion_mnist", "cifar10", "toy")
_MODELS = ("mlp", "lenet5", "cifarnet", "resnet20", "alexnet", "transformer", "lstm")
#: Models that read each image as a sequence of its rows (``zoo.data.mnist(layout="sequence")``).
SEQUENCE_MODELS = ("transformer", "lstm")


def baselines() -> tuple[str, ...]:
    """Rows of ``compare`` that are not guide families: the producers the baselines registered
    (:mod:`zoo.baselines.producers`), read when asked."""
    return tuple(PRODUCERS)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as usage errors, what would otherwise fail later: family options a family does
    not take (or values it cannot use), a CUDA device on a machine without one, a model that
    cannot take the data, a strategy Lightning's data-parallel fit does not know."""

    if args.command in ("demo", "info"):
        return
    try:
        if args.command == "fit":
            args.options = {args.guide: guide_options(args.guide_option)}
        else:
            args.options = family_options(args.guide_option, args.guides)
        for family, options in args.options.items():
            _probe_family(family, options)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device; use cpu or auto")
    if args.command == "fit" and args.strategy not in STRATEGIES:
        parser.error(f"--strategy: expected one of {', '.join(STRATEGIES)}, got {args.strategy!r}")
    images = {"mnist": "lenet5", "fashion_mnist": "lenet5", "cifar10": "cifarnet", "toy": "mlp"}
    if args.model is None:
        args.model = images[args.data]
    fits = {"lenet5": ("mnist", "fashion_mnist"), "cifarnet": ("cifar10",)}
    if args.data == "toy" and args.model != "mlp":
        parser.error(f"--data toy (1-D regression) needs --model mlp, not {args.model}")
    if args.model in fits and args.data not in fits[args.model]:
        parser.error(f"--model {args.model} takes {' or '.join(fits[args.model])} images")
    widths = {"mlp": "any number", "lenet5": "one", "lstm": "one"}  # what --hidden sets
    if args.hidden is not None and args.model not in widths:
        parser.error(
            f"--hidden sets the widths of mlp, lenet5 and lstm; --model {args.model} has its own "
            "architecture: leave --hidden out"
        )
    if args.hidden is not None and widths[args.model] == "one" and len(args.hidden) != 1:
        parser.error(f"--model {args.model} takes one --hidden width, got {args.hidden}")
    if args.model in SEQUENCE_MODELS and args.data not in ("mnist", "fashion_mnist"):
        parser.error(
            f"--model {args.model} reads mnist or fashion_mnist images as sequences of rows, "
            f"not --data {args.data}"
        )


def _probe_family(family: str, options: dict) -> None:
    """Build the family with ``options`` on a two-weight network and run it once, so a value
    it cannot use (``rank=five``) is a usage error before any data is read; a family over
    several sites (``subnetwork``) is built only (its sizes are checked against the real
    network when it is set up); the baselines' options are checked as :func:`zoo.compare`
    checks them, and a missing laplace-torch is one line."""

    if family in baselines():
        check_row((family, family, options))
        if family == "laplace":
            try:
                laplace_torch.import_laplace()
            except ImportError as err:
                raise ValueError(str(err)) from None
        return
    cls = guides.get(family)
    model = zoo.models.BayesianMLP(1, (2,), 1, noise=1.0)
    try:
        if getattr(cls, "options_in_init", False):  # its own arguments, not a site's
            guides.instantiate(family, model, dict(options))
            return
        check_family_options(cls, *cls.site_spec(**options))
        guides.instantiate(family, model, dict(options))(torch.zeros(2, 1), torch.zeros(2))
    except (TypeError, ValueError) as err:  # the probe's own sites are not the user's
        why = re.sub(r" at site '[^']*'", "", str(err))
        raise ValueError(f"--guide-option for {family}: {why}") from None


def _add_training_options(p: argparse.ArgumentParser, one_fit: bool) -> None:
    p.add_argument(
        "--model",
        default=None,
        choices=_MODELS,
        help="network (default: lenet5 for mnist and fashion_mnist, cifarnet for cifar10, mlp "
        "for toy); resnet20 and alexnet take any image set, transformer and lstm read mnist or "
        "fashion_mnist as 28 rows of 28 pixels",
    )
    p.add_argument(
        "--hidden",
        type=positive_int,
        nargs="*",
        default=None,
        help="hidden widths: MLP layers, or LeNet-5's FC width (default: 50 50 for --data toy, "
        "as the demo; else 100)",
    )
    p.add_argument("--data", default="mnist", choices=_DATASETS, help="data set")
    p.add_argument(
        "--root", default=None, help="data root (default: $ZOO_DATA, else ~/.cache/bnn-zoo/data)"
    )
    p.add_argument(
        "--limit", type=positive_int, default=None, help="use only the first N training examples"
    )
    p.add_argument(
        "--test-limit", type=positive_int, default=None, help="only the first N test examples"
    )
    p.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help="passes over the training data (default: zoo.fit's: one epoch, or the full-batch "
        "recipe of 3,000 steps for regression data of at most 2,048 examples, as --data toy)",
    )
    p.add_argument(
        "--num-steps",
        type=steps_value,
        default=None,
        help="optimiser steps instead of --epochs, or 'auto': cut the rate at a plateau of the "
        "ELBO and stop at the next (zoo.training.convergence; at most 20,000 steps)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="minibatch size (default: 128, or all the examples of small regression data)",
    )
    p.add_argument(
        "--lr",
        type=rate_value,
        default=None,
        help="Adam learning rate (default: measured by a range test at the start of a "
        "minibatch fit, its steps charged to the fit, then decaying tenfold; 1e-2 decaying on "
        "small regression data; 'auto': measured, or refused on a fit under 64 steps; a given "
        "rate is constant, except on small regression data, which decays it)",
    )
    p.add_argument(
        "--samples", type=positive_int, default=100, help="posterior samples per test input"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out-dir", default="runs", help="where to write results")
    p.add_argument(
        "--noise",
        type=noise_value,
        default=0.1,
        help="--data toy: observation noise sd (the toy's own is 0.1), 'learned' or "
        "'heteroscedastic'",
    )
    for name, cls in GROUPS.items():  # every option group's flags, as the group declares them
        g = p.add_argument_group(f"{name} (zoo.{cls.__name__})")
        add_flags(g, cls, one_fit=one_fit)


def build_parser(commands: dict[str, Callable]) -> argparse.ArgumentParser:
    """The ``zoo`` parser; ``commands`` maps ``demo``, ``fit``, ``compare`` and ``info`` to the
    functions that run them (:func:`zoo.cli.commands.build_parser` passes its module's)."""

    parser = argparse.ArgumentParser(prog="zoo", description="Bayesian neural network model zoo")
    sub = parser.add_subparsers(dest="command", required=True)
    formatter = DefaultsFormatter
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
        type=positive_int,
        default=REGRESSION_FIT["num_steps"],
        help="optimiser steps (full batch)",
    )
    p.add_argument(
        "--lr",
        type=positive_float,
        default=REGRESSION_FIT["lr"],
        help="Adam learning rate, decayed tenfold over the run",
    )
    p.add_argument("--points", type=positive_int, default=TOY_POINTS, help="training points")
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
        help="weight prior: default (the regression MLP's own, N(0, 2 / fan_in) on every "
        "weight: layerwise:1.414), learned, "
        "hierarchical, normal:S (N(0, S^2) on every weight) or layerwise:G (N(0, G^2 / fan_in))",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", default="zoo-demo.png", help="where to write the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=commands["demo"], parser=p)

    f = sub.add_parser(
        "fit",
        formatter_class=formatter,
        help="fit one model with one posterior family and evaluate it",
        description="Fit a Bayesian network with one posterior family, print the test "
        "metrics, save the fit (zoo.load) and an ArviZ netCDF of the posterior and predictive.",
    )
    _add_training_options(f, one_fit=True)
    f.add_argument("--guide", default="diagonal", choices=guides.available(), help="family")
    f.add_argument(
        "--guide-option",
        action="append",
        metavar="KEY=VALUE",
        help="family option, repeatable: rank=5, parameterization=free, block_size=none, ...",
    )
    f.add_argument("--arviz-samples", type=positive_int, default=100, help="draws in the netCDF")
    f.add_argument(
        "--arviz-points",
        type=positive_int,
        default=1000,
        help="test points in the netCDF's predictive groups",
    )
    f.set_defaults(func=commands["fit"], parser=f)

    c = sub.add_parser(
        "compare",
        formatter_class=formatter,
        help="fit several families on the same data and tabulate them",
        description="Fit each family with the same data, seed and options; print a table of "
        "parameters, speed, final ELBO and test metrics; save it as CSV with a chart.",
    )
    _add_training_options(c, one_fit=False)
    c.add_argument(
        "--guides",
        nargs="+",
        default=list(guides.available()),
        choices=list(guides.available()) + list(baselines()),
        help="families to compare (every registered family), and the baselines: "
        f"{', '.join(baselines())} (laplace with laplace-torch installed)",
    )
    c.add_argument(
        "--guide-option",
        action="append",
        metavar="FAMILY.KEY=VALUE",
        help="an option of one family, repeatable: lowrank.rank=5, "
        "tridiagonal.parameterization=free, laplace.hessian=diag, ensemble.members=5",
    )
    c.set_defaults(func=commands["compare"], parser=c)

    i = sub.add_parser(
        "info",
        formatter_class=formatter,
        help="print the versions, devices, threads and data this installation has",
        description="Print what a user and a bug report need: the versions of Python, torch, "
        "torchvision, Pyro, ArviZ and the optional extras, whether torch and torchvision work "
        "together, the devices, the threads, the data root and whether MNIST is there; each "
        "problem with what to do. Exits 1 when one stops the library from working.",
    )
    i.add_argument("--data-root", default=None, help="the data root to look in (default: "
                   "$ZOO_DATA, else ~/.cache/bnn-zoo/data)")  # fmt: skip
    i.set_defaults(func=commands["info"], parser=i)
    return parser


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default where it has one and its help does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or "default" in text or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def add_flags(parser, cls: type, one_fit: bool = True) -> None:
    """Add a ``--flag`` to ``parser`` for each field of ``cls`` that declares one (with
    ``one_fit=False``, for a command that runs several fits, none of the fields that only make
    sense for one: the processes, the checkpoint path)."""
    for f in dataclasses.fields(cls):
        spec = dict(f.metadata.get("cli", {}))
        if not spec or (spec.pop("one_fit", False) and not one_fit):
            continue
        flag = spec.pop("flag", "--" + f.name.replace("_", "-"))
        parser.add_argument(flag, dest=f.name, default=f.default, **spec)


def from_flags(cls: type, args: argparse.Namespace):
    """The ``cls`` group of parsed flags (fields without a flag keep their defaults)."""
    given = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
    }
    return cls(**given)
