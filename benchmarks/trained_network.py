"""A trained network made Bayesian: does each family's default call keep what it knew, and is
the default prior of a converted network sane? (issue 68)

    python benchmarks/trained_network.py finetune --steps 100       # every family
    python benchmarks/trained_network.py prior                      # the prior predictives

``finetune``: a CNN with batch norm (conv 16 - BN - pool - conv 32 - BN - pool - linear 10) is
trained in a plain PyTorch loop (Adam 1e-3, batch 128, ``--epochs`` over ``--train`` MNIST
digits, seed 0), then converted with ``zoo.models.from_module`` and fitted by the default call
``zoo.fit(model, family, data, num_steps=--steps)`` of every family (its recipe's rate, the
default prior and initial scale), tested on ``--test`` digits with 50 draws beside the network
itself; post-hoc Laplace (``zoo.laplace(model, data, at="module")``, last-layer KFAC: no refit)
and a Bayesian last layer on the frozen body (``bayesian=["9.*"]``, low rank) join them, and the
diagonal is also run with ``init="fresh"`` (the old default: random initial means) and with a
tenth of the default initial scale, without the initial scale relative to the trained
weights (``guides.initial.TRAINED_RELATIVE_SCALE``: every site at 0.01), and at the default rate
of a fresh start (3e-3 decaying tenfold) instead of the trained start's
(``zoo.training.recipes.TRAINED_LR_FACTOR``).

``prior``: the mean over 16 Gaussian-noise inputs and 16 prior draws of the largest class
probability (1: certain; 1/C: no preference) of networks converted with ``from_module``, under
the converted default ``N(0, 2 / fan_in)`` and under ``N(0, 1)``; batch norm normalises with
the batch's statistics (``zoo.prior_predictive``'s default).
"""

from __future__ import annotations

import argparse
import os
import time

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
    calls = {f: (lambda f=f: zoo.fit(zoo.models.from_module(net), f, (x, y),
                                     num_steps=args.steps, run=QUIET))
             for f in guides.available()}  # fmt: skip
    calls["diagonal, init='fresh'"] = lambda: zoo.fit(
        zoo.models.from_module(net, init="fresh"),
        "diagonal",
        (x, y),
        num_steps=args.steps,
        run=QUIET,
    )
    calls["diagonal, init_scale 1e-3"] = lambda: zoo.fit(
        zoo.models.from_module(net),
        guides.family("diagonal", init_scale=1e-3),
        (x, y),
        num_steps=args.steps,
        run=QUIET,
    )
    calls["last layer (lowrank), frozen body"] = lambda: zoo.fit(
        zoo.models.from_module(_frozen(net), bayesian=["9.*"]),
        "lowrank",
        (x, y),
        num_steps=args.steps,
        run=QUIET,
    )
    calls["Laplace post hoc (last layer, KFAC)"] = lambda: zoo.laplace(
        zoo.models.from_module(net), (x, y), at="module", options={"hessian": "kron"}
    )
    for label, call in calls.items():
        if args.families and label.split(",")[0] not in args.families:
            continue
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start
        probs = result.predict(xt, num_samples=50, progress=False).probs
        rows.append(_row(label, probs, yt, seconds))
        print(_line(rows[-1], rows[0]), flush=True)


def _without_relative_scale(call):
    """``call()`` with every site's initial scale the absolute ``init_scale`` (0.01)."""
    from guides import initial

    saved, initial.TRAINED_RELATIVE_SCALE = initial.TRAINED_RELATIVE_SCALE, float("inf")
    try:
        return call()
    finally:
        initial.TRAINED_RELATIVE_SCALE = saved


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
            pred = zoo.prior_predictive(from_module(net, prior=prior_), noise, num_samples=16)
            cells.append(f"{float(pred.sample_probs.max(-1).values.mean()):.3f}")
        print(f"| {label} | {cells[0]} | {cells[1]} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["finetune", "prior"])
    parser.add_argument("--train", type=int, default=10000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--families", nargs="*")
    parser.add_argument("--data-root")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute), torch threads {torch.get_num_threads()}")
    (finetune if args.what == "finetune" else prior)(args)


if __name__ == "__main__":
    main()
