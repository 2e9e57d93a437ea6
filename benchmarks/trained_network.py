"""A trained network made Bayesian: does each family's default call keep what it knew, and is
the default prior of a converted network sane? (issue 68)

    python benchmarks/trained_network.py finetune --steps 100       # every family
    python benchmarks/trained_network.py prior                      # the prior predictives
    python benchmarks/trained_network.py scratch --epochs 10        # ResNet-20 from scratch
    python benchmarks/trained_network.py                            # all three

``finetune``: a CNN with batch norm (conv 16 - BN - pool - conv 32 - BN - pool - linear 10) is
trained in a plain PyTorch loop (Adam 1e-3, batch 128, ``--epochs`` over ``--train`` MNIST
digits, seed 0), then converted with ``zoo.models.from_module`` and fitted by the default call
``zoo.fit(model, family, data, num_steps=--steps)`` of every family (its recipe's rate, the
default prior and initial scale), tested on ``--test`` digits with 50 draws beside the network
itself; post-hoc Laplace (``zoo.laplace(model, data, at="module")``, last-layer KFAC: no refit)
and a Bayesian last layer on the frozen body (``bayesian=["9.*"]``, low rank) join them, and the
diagonal is also run with ``init="fresh"`` (the old default: random initial means) and with a
tenth of the default initial scale, and at the default rate
of a fresh start (3e-3 decaying tenfold) instead of the trained start's
(``zoo.training.recipes.TRAINED_LR_FACTOR``).

``prior``: the mean over 16 Gaussian-noise inputs and ``--draws`` (16) prior draws of the
largest class probability (1: certain; 1/C: no preference) of networks converted with
``from_module``, under the converted default ``N(0, 2 / fan_in)`` and under ``N(0, 1)``; batch
norm normalises with the batch's statistics (``zoo.prior_predictive``'s default).

``scratch``: the zoo's ResNet-20 (one input channel) fitted from scratch with the diagonal
family's default call for ``--epochs`` over ``--train`` digits under ``N(0, 1)`` (the zoo's
classification default) and ``N(0, 2 / fan_in)`` (a converted network's): the KL term and the
expected log-likelihood of the ELBO at the start and at the end, and the test metrics.
"""

from __future__ import annotations

import argparse
import os
import time

import suite
import torch
import torch.nn.functional as F
from torch import nn

import zoo

QUIET = zoo.Run(progress=False)


def _tensors(dataset, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[dataset[i] for i in range(n)])
    return torch.stack(xs), torch.tensor(ys)


def _cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def _train(x, y, epochs: int) -> nn.Module:
    torch.manual_seed(0)
    net = _cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(128):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval()


def _row(label, probs, y, seconds) -> dict:
    return {
        "row": label,
        "accuracy": zoo.metrics.accuracy(probs, y),
        "nll": zoo.metrics.nll(probs, y),
        "ece": zoo.metrics.ece(probs, y),
        "seconds": seconds,
    }


def finetune(args) -> None:
    import guides

    root = args.data_root or os.environ.get("ZOO_DATA")
    x, y = _tensors(zoo.data.mnist(root), args.train)
    xt, yt = _tensors(zoo.data.mnist(root, train=False), args.test)
    start = time.perf_counter()
    net = _train(x, y, args.epochs)
    with torch.no_grad():
        rows = [_row("the network", net(xt).softmax(-1), yt, time.perf_counter() - start)]
    print("| row | accuracy | NLL | ECE | seconds |\n| --- | --- | --- | --- | --- |")
    print(_line(rows[0], rows[0]), flush=True)

    def fit(family, model=None, **kw):
        model = model or zoo.models.from_module(net, init="module")
        return zoo.fit(model, family, (x, y), num_steps=args.steps, run=QUIET, **kw)

    calls = {f: (lambda f=f: fit(f)) for f in args.families or guides.available()}
    extras = {
        "diagonal, init='fresh'": lambda: fit(
            "diagonal", zoo.models.from_module(net, init="fresh")
        ),
        "diagonal, the fresh start's rate (3e-3)": lambda: fit(
            "diagonal", lr=3e-3, optim=zoo.Optim(lr_schedule="exponential")
        ),
        "diagonal, init_scale 1e-3": lambda: fit(guides.family("diagonal", init_scale=1e-3)),
        "last layer (lowrank), frozen body": lambda: fit(
            "lowrank", zoo.models.from_module(_frozen(net), bayesian=["9.*"], init="module")
        ),
        "Laplace post hoc (last layer, KFAC)": lambda: zoo.laplace(
            zoo.models.from_module(net, init="module"),
            (x, y),
            at="module",
            options={"hessian": "kron", "prior_precision": "marglik"},
        ),
    }
    if not args.no_extras:
        calls.update(extras)
    for label, call in calls.items():
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
        probs = result.predict(xt, num_samples=50, progress=False, seed=0).probs
        rows.append(_row(label, probs, yt, seconds))
        print(_line(rows[-1], rows[0]), flush=True)


def _frozen(net: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(net).requires_grad_(False)


def _line(row: dict, base: dict) -> str:
    return (
        f"| {row['row']} | {row['accuracy']:.4f} ({row['accuracy'] - base['accuracy']:+.4f}) | "
        f"{row['nll']:.4f} ({row['nll'] - base['nll']:+.4f}) | "
        f"{row['ece']:.4f} ({row['ece'] - base['ece']:+.4f}) | {row['seconds']:.0f} |"
    )


def prior(args) -> None:
    from torchvision import models as tv

    from zoo.models import from_module

    def lenet():
        return zoo.models.LeNet5().net

    nets = {
        "the CNN above (untrained)": (_cnn, (1, 28, 28)),
        "LeNet-5 (zoo's network, converted)": (lenet, (1, 28, 28)),
        "ResNet-20 (zoo's network, converted)": (lambda: zoo.models.ResNet().net, (3, 32, 32)),
        "torchvision ResNet-18": (lambda: tv.resnet18(num_classes=10), (3, 64, 64)),
        "torchvision MobileNet V3 small": (
            lambda: tv.mobilenet_v3_small(num_classes=10),
            (3, 64, 64),
        ),
    }
    print("| network | N(0, 2 / fan_in) (default) | N(0, 1) |")
    print("| --- | --- | --- |")
    for label, (make, shape) in nets.items():
        torch.manual_seed(0)
        net = make()
        noise = torch.randn(16, *shape, generator=torch.Generator().manual_seed(1))
        cells = []
        for prior_ in (None, 1.0):
            model = from_module(net, prior=prior_, init="module")
            pred = zoo.prior_predictive(model, noise, num_samples=args.draws)
            cells.append(f"{float(pred.sample_probs.max(-1).values.mean()):.3f}")
        print(f"| {label} | {cells[0]} | {cells[1]} |", flush=True)


def scratch(args) -> None:
    from zoo.priors import HE_GAIN, LayerwiseNormalPrior

    root = args.data_root or os.environ.get("ZOO_DATA")
    x, y = _tensors(zoo.data.mnist(root), args.train)
    xt, yt = _tensors(zoo.data.mnist(root, train=False), args.test)
    print("| prior | KL at the start | KL at the end | expected log-likelihood at the end | "
          "accuracy | NLL | ECE | seconds |")  # fmt: skip
    print("| --- " * 8 + "|")
    for label, prior in [("N(0, 1)", 1.0), ("N(0, 2 / fan_in)", LayerwiseNormalPrior(HE_GAIN))]:
        torch.manual_seed(0)
        model = zoo.models.ResNet(20, in_channels=1, input_size=28, prior=prior)
        start = time.perf_counter()
        fit = zoo.fit(model, "diagonal", (x, y), epochs=args.epochs, run=QUIET)
        seconds = time.perf_counter() - start
        kl0, kl1 = _kl(fit, model, init=True), _kl(fit, model, init=False)
        data_term = -sum(fit.losses[-20:]) / 20 + kl1
        probs = fit.predict(xt, num_samples=20, progress=False, seed=0).probs
        r = _row(label, probs, yt, seconds)
        print(f"| {label} | {kl0:,.0f} | {kl1:,.0f} | {data_term:,.0f} | {r['accuracy']:.4f} | "
              f"{r['nll']:.4f} | {r['ece']:.4f} | {seconds:.0f} |", flush=True)  # fmt: skip


def _kl(fit, model, init: bool) -> float:
    """The closed-form KL of the diagonal guide (fitted, or as a fresh guide starts) to the
    prior, summed over the sites."""
    from torch.distributions import kl_divergence

    import guides

    guide = fit.guide
    if init:
        guide = guides.AutoDiagonal(model)
        with zoo.models.frozen_statistics(), torch.no_grad():
            guide(torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long))
    total = 0.0
    with torch.no_grad():
        for name, shape in model.site_shapes.items():
            prior = model.prior.site_distribution(name, shape, model._fan_in[name], {})
            total += float(kl_divergence(guide.get_posterior(name), prior))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--train", type=int, default=10000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--families", nargs="*", help="default: guides.available()")
    parser.add_argument("--no-extras", action="store_true", help="the families' rows only")
    parser.add_argument("--draws", type=int, default=16, help="prior draws (prior)")
    parser.add_argument("--data-root")
    parser.add_argument(
        "--out", default=None, help="default: benchmarks/results/trained_network.json"
    )
    args = parser.parse_args()
    with suite.record("trained_network", args.out):
        for what in args.what:
            print(f"\n{what}:")
            MODES[what](args)


#: The parts of the run, in order (each prints its table).
MODES = {"finetune": finetune, "prior": prior, "scratch": scratch}


if __name__ == "__main__":
    main()
