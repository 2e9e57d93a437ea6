"""LeNet-5 on the full MNIST: one family's test metrics, or the MC dropout study.

    python benchmarks/mnist_accuracy.py --guide diagonal --epochs 2 --data ../shared/datasets
    python benchmarks/mnist_accuracy.py --dropout-study --data ../shared/datasets \
        --samples 50 --json benchmarks/results/mnist_dropout.json
    python benchmarks/mnist_accuracy.py --dropout-factors --data ../shared/datasets \
        --samples 50 --json benchmarks/results/mnist_dropout_factors.json
    python benchmarks/mnist_accuracy.py --dropout-seeds --seeds 0 1 2 --data ../shared/datasets \
        --samples 50 --json benchmarks/results/mnist_dropout_seeds.json

``--dropout-study`` (issue 35) fits, on the same data, seed, batch size (128), learning rate
(1e-3) and epochs: the library's ``mc_dropout`` family as notebook 07 used it before (``p = 0.1``
on every layer's inputs, the image included, one mask per step for the whole minibatch), then
one change at a time (a mask per image: ``estimator="local"``; no dropout on the image:
``input_p = 0``, the new default), a plain-PyTorch reference with the same dropout placement
and the L2 penalty of the same prior (``benchmarks/dropout_reference.py``), and the diagonal
family and MAP for context. Every row is scored on the same test images with the same number of
draws per image; the ECE has 15 bins. ``--dropout-factors`` then changes the new default one
factor at a time (``p``, the prior's scale, i.e. the weight decay, ``sigma``, the KL weight, the
epochs) and scores the default's fit with 10, 50 and 200 draws per image; ``--dropout-seeds``
repeats the new default and the plain-PyTorch reference over seeds (mean and standard deviation).
"""

from __future__ import annotations

import argparse
import os
import time

from saving import write_json

import guides
import zoo
from zoo.models.likelihoods import Categorical
from zoo.training.options import grouped

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
#: ``--dropout-factors``: one change at a time to the new default (``p = 0.1``, none on the
#: image, a mask per step): (label, guide options, fit options, model options).
FACTOR_ROWS = [
    ("default: p=0.1, none on the image", {}, {}, {}),
    ("p=0.5 (Gal's LeNet-all)", {"p": 0.5}, {}, {}),
    # Gal's Caffe LeNet: weight decay 5e-4 = (1 - p) / (N s^2) -> s = sqrt(0.9 / 30) = 0.17
    ("prior N(0, 0.17^2): weight decay 5e-4", {}, {}, {"prior": 0.17}),
    ("sigma = 1e-2 (default 1e-3)", {"sigma": 1e-2}, {}, {}),
    ("KL weight 0 (no L2 term)", {}, {"kl_weight": 0.0}, {}),
    ("3 epochs", {}, {"epochs": 3}, {}),
]
#: Test-time draws per image for the default's fit.
DRAWS = (10, 50, 200)


def library_fit(train, family, guide_options, fit_options, args, model_options=None):
    """``(fit, seconds)`` of LeNet-5 with ``family`` on ``train``."""
    start = time.perf_counter()
    options = {"epochs": args.epochs, **fit_options}
    fit = zoo.fit(
        zoo.models.LeNet5(**(model_options or {})),
        guides.family(family, **guide_options),
        train,
        seed=args.seed,
        **grouped({"progress": False, **options}),
    )
    return fit, time.perf_counter() - start


def library_row(train, test, label, family, guide_options, fit_options, args) -> dict:
    fit, seconds = library_fit(train, family, guide_options, fit_options, args)
    return scored(fit, seconds, label, test, args.samples)


def scored(fit, seconds: float, label: str, test, samples: int) -> dict:
    x, y = test.tensors
    pred = fit.predict(x, num_samples=samples, seed=0, progress=False)
    row = {"row": label, "fit_s": seconds, "steps": fit.steps, "draws": samples}
    return {**row, **fit.model.likelihood.metrics(pred, y)}


def dropout_factors(train, test, args) -> list[dict]:
    """The ``FACTOR_ROWS``, then the default's fit scored with each of ``DRAWS`` draws."""
    rows, default = [], None
    for label, guide_options, fit_options, model_options in FACTOR_ROWS:
        fit, seconds = library_fit(
            train, "mc_dropout", guide_options, fit_options, args, model_options
        )
        default = default or (fit, seconds)
        rows.append(scored(fit, seconds, label, test, args.samples))
        print(rows[-1], flush=True)
    for draws in DRAWS:
        rows.append(scored(*default, f"default, {draws} draws per image", test, draws))
        print(rows[-1], flush=True)
    return rows


def torch_row(data, test, label, p, args) -> dict:
    from dropout_reference import predict, train

    start = time.perf_counter()
    net = train(data, p, epochs=args.epochs, seed=args.seed)
    seconds = time.perf_counter() - start
    x, y = test.tensors
    pred = predict(net, x, args.samples, seed=0)
    steps = args.epochs * -(-len(data) // 128)
    row = {"row": label, "fit_s": seconds, "steps": steps, "draws": args.samples}
    return {**row, **Categorical().metrics(pred, y)}


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


#: ``--dropout-seeds``: the new default against the plain-PyTorch reference over seeds.
SEED_ROWS = [LIBRARY_ROWS[2], LIBRARY_ROWS[3]]


def dropout_seeds(train, test, args) -> list[dict]:
    """The library's new default (a mask per step and per image) and the plain-PyTorch
    reference without image dropout, each fitted with every seed of ``args.seeds``."""
    rows = []
    for seed in args.seeds:
        args.seed = seed
        for label, guide_options, fit_options in SEED_ROWS:
            row = library_row(train, test, label, "mc_dropout", guide_options, fit_options, args)
            rows.append({**row, "seed": seed})
            print(rows[-1], flush=True)
        label, p = TORCH_ROWS[1]
        rows.append({**torch_row(train, test, label, p, args), "seed": seed})
        print(rows[-1], flush=True)
    return rows


def print_seed_summary(rows: list[dict]) -> None:
    """Mean and standard deviation over seeds of each row's metrics."""
    import statistics

    print("| row | seeds | accuracy | NLL | ECE | Brier |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label in dict.fromkeys(r["row"] for r in rows):
        group = [r for r in rows if r["row"] == label]
        cells = []
        for key in ("accuracy", "nll", "ece", "brier"):
            values = [r[key] for r in group]
            sd = statistics.stdev(values) if len(values) > 1 else float("nan")
            cells.append(f"{statistics.fmean(values):.4f} ± {sd:.4f}")
        print(f"| {label} | {len(group)} | {' | '.join(cells)} |")


def print_table(rows: list[dict]) -> None:
    print("| row | steps | fit s | draws | accuracy | NLL | ECE | Brier |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['row']} | {r['steps']} | {r['fit_s']:.0f} | {r['draws']} | {r['accuracy']:.4f} "
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
    parser.add_argument(
        "--dropout-factors", action="store_true", help="the new default, one change at a time"
    )
    parser.add_argument(
        "--dropout-seeds",
        action="store_true",
        help="the new default against the plain-PyTorch reference, over --seeds",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-limit", type=int, default=None, help="first N training images")
    parser.add_argument("--test-limit", type=int, default=None, help="first N test images")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    study = args.dropout_study or args.dropout_factors or args.dropout_seeds
    args.epochs = args.epochs or (1 if study else 2)

    train = zoo.data.mnist(args.data, limit=args.train_limit)
    test = zoo.data.mnist(args.data, train=False, limit=args.test_limit)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)", flush=True)
    if args.dropout_study:
        rows = dropout_study(train, test, args)
    elif args.dropout_factors:
        rows = dropout_factors(train, test, args)
    elif args.dropout_seeds:
        rows = dropout_seeds(train, test, args)
        print_seed_summary(rows)
    else:
        family = args.guide
        rows = [library_row(train, test, family, family, {}, {}, args)]
    print_table(rows)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
    if args.json:
        write_json({"args": vars(args), "rows": rows}, args.json)
    return rows


if __name__ == "__main__":
    main()
