"""Time one SVI step of zoo.fit per family against hand-written and peer implementations.

    python benchmarks/step_time.py                      # MLP 784-400-400-10, batch 128, CPU
    python benchmarks/step_time.py --net lenet5         # LeNet-5
    python benchmarks/step_time.py --device cuda        # same script on a GPU

All methods run in one process, interleaved in blocks (every method runs a block of steps, then
the next method, for several rounds), and the table reports the median step time as a ratio to
the hand-written Bayes-by-Backprop step (diagonal Gaussian, analytic KL, written below as the
floor to approach). The zoo rows use zoo.fit's defaults (plain reparameterisation, Trace_ELBO)
unless the row names another estimator (see zoo.estimators). bayesian-torch is timed when it
is installed (``pip install bayesian-torch``; it is not a dependency of the project).
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import nn
from torch.func import functional_call

import guides
import zoo
from zoo.models.lenet import LeNet5Network
from zoo.models.mlp import mlp_network

N_TRAIN = 60_000  # the data size that scales the likelihood, as for MNIST


def make_net(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    if name == "mlp":
        return mlp_network(784, (400, 400), 10), (784,)
    return LeNet5Network(100), (1, 28, 28)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---- the floor and the peers -------------------------------------------------------------
def deterministic_step(net, x, y):
    net = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y, reduction="sum") * (N_TRAIN / len(x))
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in net.parameters())


def hand_bbb_step(net, x, y):
    """Bayes by Backprop by hand: w = mu + softplus(rho) eps, analytic KL to N(0, 1)."""
    net = copy.deepcopy(net).requires_grad_(False)
    mus = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
    rhos = {n: torch.full_like(p, -4.6).requires_grad_() for n, p in net.named_parameters()}
    opt = torch.optim.Adam([*mus.values(), *rhos.values()], lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        weights, kl = {}, 0.0
        for n in mus:
            sd = F.softplus(rhos[n])
            weights[n] = mus[n] + sd * torch.randn_like(sd)
            kl = kl + 0.5 * (sd.pow(2) + mus[n].pow(2) - 1 - 2 * sd.log()).sum()
        nll = F.cross_entropy(functional_call(net, weights, (x,)), y, reduction="sum")
        loss = nll * (N_TRAIN / len(x)) + kl
        loss.backward()
        opt.step()

    return step, 2 * sum(p.numel() for p in mus.values())


def pyro_autonormal_step(net, x, y):
    model = zoo.models.BayesianModel(copy.deepcopy(net), task="classification")
    model.to(x.device)
    scaled = zoo.ElboScale(data_scale=N_TRAIN / len(x))(model)
    guide = AutoNormal(scaled, init_scale=0.01)
    svi = SVI(scaled, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO(max_plate_nesting=1))
    svi.step(x, y)
    return (lambda: svi.step(x, y)), sum(p.numel() for p in guide.parameters())


def bayesian_torch_step(net, x, y):
    from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

    bnn = copy.deepcopy(net)
    dnn_to_bnn(
        bnn,
        {
            "prior_mu": 0.0,
            "prior_sigma": 1.0,
            "posterior_mu_init": 0.0,
            "posterior_rho_init": -4.6,
            "type": "Reparameterization",
            "moped_enable": False,
        },
    )
    bnn.to(x.device)
    opt = torch.optim.Adam(bnn.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = bnn(x)
        loss = F.cross_entropy(out, y, reduction="sum") * (N_TRAIN / len(x)) + get_kl_loss(bnn)
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in bnn.parameters())


# ---- zoo.fit ----------------------------------------------------------------------------
class ZooStep:
    """Runs zoo.fit on one batch repeatedly; step times come from inside its loop."""

    def __init__(self, net, x, y, family, options, device, **fit_options):
        self.model = zoo.models.BayesianModel(copy.deepcopy(net), task="classification")
        self.data = (x, y)
        self.device = device
        # The data are one batch of a 60,000-example set: scale the likelihood as fit would.
        self.model.to(device)
        self.guide = guides.get(family)(self.model, **options)
        with torch.no_grad():
            self.guide(x, y)
        self.times: list[float] = []
        self.fit_options = fit_options

    def run(self, steps):
        stamps = []

        def stamp(state):
            sync(self.device)
            stamps.append(time.perf_counter())

        zoo.fit(
            self.model,
            self.guide,
            self.data,
            num_steps=steps + 1,
            batch_size=len(self.data[0]),
            progress=False,
            device=self.device,
            callbacks=[stamp],
            kl_weight=1.0,
            **self.fit_options,
        )
        self.times += [b - a for a, b in zip(stamps[:-1], stamps[1:])]


def build_methods(net, x, y, device) -> dict:
    """Name -> constructor of a step function ``(step, parameter count)`` or a ZooStep."""
    methods = {
        "deterministic": lambda: deterministic_step(net, x, y),
        "hand-written BBB": lambda: hand_bbb_step(net, x, y),
        "pyro AutoNormal + SVI": lambda: pyro_autonormal_step(net, x, y),
    }
    try:
        import bayesian_torch  # noqa: F401

        methods["bayesian-torch"] = lambda: bayesian_torch_step(net, x, y)
    except ImportError:
        print("bayesian-torch is not installed: its row is left out")
    zoo_rows = {
        "zoo diagonal": ("diagonal", {}, {}),
        "zoo tridiagonal posch": ("tridiagonal", {}, {}),
        "zoo tridiagonal free": ("tridiagonal", {"parameterization": "free"}, {}),
        "zoo lowrank r=10": ("lowrank", {"rank": 10}, {}),
        "zoo matrix normal": ("matrix_normal", {}, {}),
        "zoo block diagonal b=16": ("block_diagonal", {}, {}),
        "zoo MC dropout p=0.1": ("mc_dropout", {}, {}),
        "zoo MC dropout, local reparam. (a mask per example)": (
            "mc_dropout",
            {},
            {"estimator": "local"},
        ),
        "zoo MC dropout, closed-form KL": ("mc_dropout", {}, {"elbo": "meanfield"}),
        "zoo MC dropout, local reparam., closed-form KL": (
            "mc_dropout",
            {},
            {"estimator": "local", "elbo": "meanfield"},
        ),
        "zoo map (point mass)": ("map", {}, {}),
        "zoo diagonal, local reparam.": ("diagonal", {}, {"estimator": "local"}),
        "zoo diagonal, flipout": ("diagonal", {}, {"estimator": "flipout"}),
        "zoo matrix normal, local reparam., closed-form KL": (
            "matrix_normal",
            {},
            {"estimator": "local", "elbo": "meanfield"},
        ),
    }
    for name, (family, options, fit_options) in zoo_rows.items():
        methods[name] = lambda f=family, o=options, k=fit_options: ZooStep(
            net, x, y, f, o, device, **k
        )
    return methods


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_memory_mib(args, name: str) -> float:
    """CPU peak memory of ``name``: the peak resident memory that building it and running 3
    steps adds to a fresh process (polled every 0.5 ms). On CUDA, main reads the allocator's
    peak in-process instead."""
    command = [sys.executable, __file__, "--net", args.net, "--batch-size", str(args.batch_size)]
    out = subprocess.run(
        command + ["--memory-of", name], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="zoo.fit step time against the floor and peers")
    parser.add_argument("--net", default="mlp", choices=("mlp", "lenet5"))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=20, help="steps per method per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--only", nargs="+", default=None, help="time only methods whose name contains one of these"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory column")
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pyro.set_rng_seed(0)
    net, shape = make_net(args.net)
    net.to(device)
    x = torch.randn((args.batch_size,) + shape, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    if args.memory_of:  # child process of peak_memory_mib
        baseline = _rss_mib()
        peak = [baseline]
        done = threading.Event()

        def poll():
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mib())
                time.sleep(0.0005)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        built = build_methods(net, x, y, device)[args.memory_of]()
        for _ in range(3):
            built.run(1) if isinstance(built, ZooStep) else built[0]()
        done.set()
        watcher.join()
        print(max(peak[0], _rss_mib()) - baseline)
        return
    builders = build_methods(net, x, y, device)
    if args.only:
        builders = {
            k: v
            for k, v in builders.items()
            if k in ("hand-written BBB", "zoo diagonal") or any(s in k for s in args.only)
        }
    methods, zoo_steps = {}, {}
    for name, build in builders.items():
        built = build()
        if isinstance(built, ZooStep):
            zoo_steps[name] = built
        else:
            methods[name] = built
    times = defaultdict(list)
    for step, _ in methods.values():  # warm-up
        for _ in range(3):
            step()
    cuda_peak = defaultdict(float)

    def reset_peak():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def read_peak(name):
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) / 2**20
            cuda_peak[name] = max(cuda_peak[name], peak)

    for _ in range(args.rounds):
        for name, (step, _) in methods.items():
            reset_peak()
            for _ in range(args.steps):
                sync(device)
                t = time.perf_counter()
                step()
                sync(device)
                times[name].append(time.perf_counter() - t)
            read_peak(name)
        for name, runner in zoo_steps.items():
            reset_peak()
            runner.run(args.steps)
            read_peak(name)
    for name, runner in zoo_steps.items():
        times[name] = runner.times
    counts = {name: n for name, (_, n) in methods.items()}
    counts.update({name: r.guide.num_variational_parameters() for name, r in zoo_steps.items()})
    floor = statistics.median(times["hand-written BBB"])
    diag = statistics.median(times["zoo diagonal"])
    print(
        f"\n{args.net}, batch {args.batch_size}, {device}, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds x {args.steps} steps, medians\n"
    )
    memory = {}
    if not args.no_memory:
        for name in times:
            memory[name] = cuda_peak[name] if device.type == "cuda" else peak_memory_mib(args, name)
    where = "allocator peak" if device.type == "cuda" else "peak RSS added by building and stepping"
    print(
        f"| method | ms / step | x hand-written BBB | x zoo diagonal | parameters | MiB ({where}) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, values in times.items():
        med = statistics.median(values)
        mib = f"{memory[name]:.0f}" if name in memory else "-"
        print(
            f"| {name} | {1e3 * med:.2f} | {med / floor:.2f} | {med / diag:.2f} "
            f"| {counts[name]:,} | {mib} |"
        )


if __name__ == "__main__":
    main()
