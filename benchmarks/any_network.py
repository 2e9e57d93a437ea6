"""The cost of being Bayesian on the networks users bring: one ``zoo.fit`` step per family
against the same network's deterministic step (plain PyTorch: forward, cross-entropy, backward,
Adam), on ResNet-20 (batch norm) and the transformer and LSTM classifiers over sequential MNIST,
and the accuracy and calibration after a fixed budget of steps on MNIST.

A step's time is read as the difference of two fits' wall times (``--short`` and ``--long``
steps) over the difference of their steps, which cancels each fit's start-up; the deterministic
step is timed the same way, in the same process, so ratios are side by side.

    python benchmarks/any_network.py --root ../shared/datasets
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import suite
import torch
import torch.nn.functional as F

import guides
import zoo

NETWORKS = {
    "resnet20": (lambda: zoo.models.ResNet(20, in_channels=1, input_size=28), "image"),
    "transformer": (
        lambda: zoo.models.TransformerClassifier(in_features=28, seq_len=28),
        "sequence",
    ),
    "lstm": (lambda: zoo.models.RecurrentClassifier(28, hidden=64, seq_len=28), "sequence"),
}
#: Issue 96's target: every family's step at most this times the deterministic step.
TARGET = 1.3
FAMILIES = {
    "map": "map",
    "diagonal": "diagonal",
    "lowrank": "lowrank",
    "matrix_normal": "matrix_normal",
    "tridiagonal": "tridiagonal",
    "block_diagonal": "block_diagonal",
    "whvi (diagonal q(g))": guides.family("whvi", covariance="diagonal"),
    "mc_dropout": "mc_dropout",
}


def deterministic_seconds(make, x, y, steps: int, batch: int, threads: int) -> float:
    """Wall time of ``steps`` plain PyTorch steps of the network (its own weights, trainable)
    at ``threads`` intra-op threads (the caller's setting back afterwards)."""
    net = make().net
    net.requires_grad_(True).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        for k in range(steps):
            i = (k * batch) % (len(x) - batch)
            loss = F.cross_entropy(net(x[i : i + batch]), y[i : i + batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


def fit_seconds(make, family, data, steps: int, batch: int):
    start = time.perf_counter()
    fit = zoo.fit(
        make(), family, data, num_steps=steps, batch_size=batch, run=zoo.Run(progress=False)
    )
    return time.perf_counter() - start, fit


def step_table(name: str, make, x, y, args) -> None:
    """Each family's step against the deterministic step at the threads the fit chose: rounds
    of every row in turn (the deterministic step beside each family), medians over them."""
    span = args.long - args.short

    def deterministic(threads: int) -> float:
        torch.manual_seed(0)
        long = deterministic_seconds(make, x, y, args.long, args.batch, threads)
        short = deterministic_seconds(make, x, y, args.short, args.batch, threads)
        return (long - short) / span

    steps = {label: [] for label in args.families}
    plain = {label: [] for label in args.families}
    threads, jit = {}, {}
    for _ in range(args.repeat):
        for label in args.families:
            family = FAMILIES[label]
            short, _ = fit_seconds(make, family, (x, y), args.short, args.batch)
            long, fit = fit_seconds(make, family, (x, y), args.long, args.batch)
            threads[label] = fit.options["threads"]
            jit[label] = str(fit.options["jit"]).split(" (")[0]
            steps[label].append((long - short) / span)
            plain[label].append(deterministic(threads[label]))
    print(f"\n{name} (medians of {args.repeat} rounds; load {os.getloadavg()[0]:.2f})")
    print("| family | threads | loss | ms per step | deterministic ms | x deterministic | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label in args.families:
        step, base = statistics.median(steps[label]), statistics.median(plain[label])
        met = "met" if step / base <= TARGET else "missed"
        print(
            f"| {label} | {threads[label]} | {jit[label]} | {1000 * step:.1f} | "
            f"{1000 * base:.1f} | {step / base:.2f} | <= {TARGET:.2f}: {met} |",
            flush=True,
        )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=None, help="data root holding MNIST/raw")
    p.add_argument("--nets", nargs="*", default=list(NETWORKS), choices=list(NETWORKS))
    p.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--short", type=int, default=3)
    p.add_argument("--long", type=int, default=23)
    p.add_argument("--repeat", type=int, default=3, help="rounds of the step table")
    p.add_argument("--budget", type=int, default=0, help="steps of an accuracy run (0: none)")
    p.add_argument("--test", type=int, default=1000, help="test images of an accuracy run")
    p.add_argument("--draws", type=int, default=10, help="weight draws per test image")
    p.add_argument("--out", default=None, help="default: benchmarks/results/any_network.json")
    args = p.parse_args(argv)
    with suite.record("any_network", args.out, argv):
        print(
            f"torch {torch.__version__}, threads {torch.get_num_threads()}, load "
            f"{os.getloadavg()[0]:.2f}, batch {args.batch}"
        )
        for name in args.nets:
            make, layout = NETWORKS[name]
            train = zoo.data.mnist(
                args.root,
                limit=max(args.batch * (args.long + 1), args.budget * args.batch),
                layout=layout,
            )
            x, y = train.tensors
            step_table(name, make, x, y, args)
            if args.budget:
                test = zoo.data.mnist(args.root, train=False, limit=args.test, layout=layout)
                print(
                    f"\n{name}: {args.budget} steps of batch {args.batch}, lr 1e-2, "
                    f"{args.test} test images, {args.draws} draws"
                )
                print("| family | accuracy | nll | ece | load |")
                print("| --- | --- | --- | --- | --- |")
                for label in args.families:
                    fit = zoo.fit(
                        make(),
                        FAMILIES[label],
                        (x, y),
                        num_steps=args.budget,
                        batch_size=args.batch,
                        lr=1e-2,
                        run=zoo.Run(progress=False),
                    )
                    m = fit.evaluate(test.tensors, num_samples=args.draws, progress=False)
                    print(
                        f"| {label} | {m['accuracy']:.3f} | {m['nll']:.3f} | {m['ece']:.3f} | "
                        f"{os.getloadavg()[0]:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
