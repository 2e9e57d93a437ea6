"""LeNet-5 on the full MNIST: one family's test metrics, or the MC dropout study.

    python benchmarks/mnist_accuracy.py --guide diagonal --epochs 2 --data ../shared/datasets
    python benchmarks/mnist_accuracy.py --dropout-study --data ../shared/datasets \
        --json benchmarks/results/mnist_dropout.json

``--dropout-study`` (issue 35) fits, on the same data, seed, batch size (128), learning rate
(1e-3) and epochs: the library's ``mc_dropout`` family as notebook 07 used it before (``p = 0.1``
on every layer's inputs, the image included, one mask per step for the whole minibatch), then
one change at a time (a mask per image: ``estimator="local"``; no dropout on the image:
``input_p = 0``, the new default), a plain-PyTorch reference with the same dropout placement
and the L2 penalty of the same prior (``benchmarks/dropout_reference.py``), and the diagonal
family and MAP for context. Every row is scored on the same test images with the same number of
draws per image; the ECE has 15 bins.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import guides
import zoo
from zoo import metrics

#: The study's library rows: (label, guide options, fit options).
LIBRARY_ROWS = [
    ("mc_dropout, p=0.1 on every layer incl. the image, a mask per step", {"input_p": 0.1}, {}),
    (
        "mc_dropout, p=0.1 on every layer incl. the image, a mask per image",
        {"input_p": 0.1},
        {"estimator": "local"},
    ),
    ("mc_dropout, p=0.1, none on the image, a mask per step", {"input_p": 0.0}, {}),
    (
        "mc_dropout, p=0.1, none on the image, a mask per image",
        {"input_p": 0.0},
        {"estimator": "local"},
    ),
]
#: The plain-PyTorch rows: (label, dropout probability of each layer's inputs).
TORCH_ROWS = [
    (
        "plain PyTorch dropout, p=0.1 on every layer incl. the image",
        {"conv1": 0.1, "conv2": 0.1, "fc1": 0.1, "fc2": 0.1},
    ),
    ("plain PyTorch dropout, p=0.1, none on the image", {"conv2": 0.1, "fc1": 0.1, "fc2": 0.1}),
]
CONTEXT_ROWS = ["diagonal", "map"]


def scores(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy, NLL, ECE and Brier score of predictive probabilities ``(N, 10)``."""
    return {
        "accuracy": metrics.accuracy(probs, labels),
        "nll": metrics.nll(probs, labels),
        "ece": metrics.ece(probs, labels),
        "brier": metrics.brier(probs, labels),
    }


def library_row(train, test, label, family, guide_options, fit_options, args) -> dict:
    start = time.perf_counter()
    fit = zoo.fit(
        zoo.models.LeNet5(),
        family,
        train,
        epochs=args.epochs,
        seed=args.seed,
        guide_options=guide_options,
        progress=False,
        **fit_options,
    )
    seconds = time.perf_counter() - start
    x, y = test.tensors
    pred = fit.predict(x, num_samples=args.samples, seed=0, progress=False)
    return {"row": label, "fit_s": seconds, "steps": fit.steps, **scores(pred.probs, y)}


def torch_row(train, test, label, p, args) -> dict:
    from dropout_reference import mc_probs
    from dropout_reference import train as train_reference

    start = time.perf_counter()
    net = train_reference(train, p, epochs=args.epochs, seed=args.seed)
    seconds = time.perf_counter() - start
    x, y = test.tensors
    probs = mc_probs(net, x, args.samples, seed=0)
    steps = args.epochs * -(-len(train) // 128)
    return {"row": label, "fit_s": seconds, "steps": steps, **scores(probs, y)}


def dropout_study(train, test, args) -> list[dict]:
    rows = []
    for label, guide_options, fit_options in LIBRARY_ROWS:
        rows.append(library_row(train, test, label, "mc_dropout", guide_options, fit_options, args))
        print(rows[-1], flush=True)
    for label, p in TORCH_ROWS:
        rows.append(torch_row(train, test, label, p, args))
        print(rows[-1], flush=True)
    for family in CONTEXT_ROWS:
        rows.append(library_row(train, test, family, family, {}, {}, args))
        print(rows[-1], flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| row | steps | fit s | accuracy | NLL | ECE | Brier |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['row']} | {r['steps']} | {r['fit_s']:.0f} | {r['accuracy']:.4f} "
            f"| {r['nll']:.4f} | {r['ece']:.4f} | {r['brier']:.4f} |"
        )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guide", default="diagonal", choices=guides.available())
    parser.add_argument("--epochs", type=int, default=None, help="default: 2, the study 1")
    parser.add_argument("--samples", type=int, default=100, help="posterior samples per image")
    parser.add_argument("--data", default=None, help="data root (default: $ZOO_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dropout-study", action="store_true", help="the MC dropout study")
    parser.add_argument("--train-limit", type=int, default=None, help="first N training images")
    parser.add_argument("--test-limit", type=int, default=None, help="first N test images")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (1 if args.dropout_study else 2)

    train = zoo.data.mnist(args.data, limit=args.train_limit)
    test = zoo.data.mnist(args.data, train=False, limit=args.test_limit)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)", flush=True)
    if args.dropout_study:
        rows = dropout_study(train, test, args)
    else:
        family = args.guide
        rows = [library_row(train, test, family, family, {}, {}, args)]
    print_table(rows)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
