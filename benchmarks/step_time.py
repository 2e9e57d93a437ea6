"""Time one SVI step of zoo.fit per family against hand-written and peer implementations.

    python benchmarks/step_time.py                      # MLP 784-400-400-10, batch 128, CPU
    python benchmarks/step_time.py --net lenet5         # LeNet-5
    python benchmarks/step_time.py --net tiny           # 13-50-1 regression MLP, batch 32
    python benchmarks/step_time.py --device cuda        # same script on a GPU

All methods run in one process, interleaved in blocks (every method runs a block of steps, then
the next method, for several rounds), and the table reports the median step time as a ratio to
the hand-written Bayes-by-Backprop step (diagonal Gaussian, analytic KL, written below as the
floor to approach). The zoo rows use zoo.fit's defaults (plain reparameterisation, Trace_ELBO)
unless the row names another estimator (see zoo.inference.estimators). bayesian-torch is timed when
it is installed (``pip install bayesian-torch``; it is not a dependency of the project).

``--net tiny`` is a regression net (13 inputs as in the small UCI sets, 50 hidden units, Gaussian
likelihood with a fixed noise of 1, as the hand-written step assumes), where the per-step host
work dominates. Each step is timed alone, the device waited for at its end (on the CPU a
callback's timestamps inside one fit for the zoo rows). Memory per family:
``benchmarks/step_memory.py``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable

import pyro
import suite
import torch
import torch.nn.functional as F
from pyro.infer import SVI, JitTrace_ELBO, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import nn
from torch.func import functional_call

import guides
import zoo
from zoo.models.lenet import LeNet5Network
from zoo.models.mlp import mlp_network
from zoo.training.options import grouped

N_TRAIN = 60_000  # the data size that scales the likelihood, as for MNIST


NETS = ("mlp", "lenet5", "tiny")
#: The default minibatch of each net.
BATCH_SIZES = {"mlp": 128, "lenet5": 128, "tiny": 32}


def make_net(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    if name == "mlp":
        return mlp_network(784, (400, 400), 10), (784,)
    if name == "tiny":
        return mlp_network(13, (50,), 1), (13,)
    return LeNet5Network(100), (1, 28, 28)


def task_of(y: torch.Tensor) -> str:
    return "regression" if y.is_floating_point() else "classification"


def nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The minibatch's negative log-likelihood: categorical, or Gaussian with noise sd 1."""
    if task_of(y) == "classification":
        return F.cross_entropy(out, y, reduction="sum")
    resid = out.squeeze(-1) - y
    return 0.5 * resid.pow(2).sum() + 0.5 * y.numel() * math.log(2 * math.pi)


def bayesian_model(net: nn.Module, y: torch.Tensor) -> zoo.models.BayesianModel:
    """The zoo model of ``net`` for these targets (fixed noise 1 for regression)."""
    if task_of(y) == "classification":
        return zoo.models.BayesianModel(copy.deepcopy(net), task="classification")
    return zoo.models.BayesianModel(
        copy.deepcopy(net), task="regression", noise=1.0, prior=zoo.priors.NormalPrior(1.0)
    )


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---- the floor and the peers -------------------------------------------------------------
def deterministic_step(net, x, y):
    net = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nll(net(x), y) * (N_TRAIN / len(x))
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in net.parameters())


def bbb_loss(net) -> tuple[Callable, list[torch.Tensor]]:
    """Bayes by Backprop's loss by hand: w = mu + softplus(rho) eps, analytic KL to N(0, 1).
    Returns ``loss(x, y, n)`` (``n``: the data size that scales the likelihood) and the
    parameters (every ``mu``, then every ``rho``)."""
    net = copy.deepcopy(net).requires_grad_(False)
    mus = {k: p.detach().clone().requires_grad_() for k, p in net.named_parameters()}
    rhos = {k: torch.full_like(p, -4.6).requires_grad_() for k, p in net.named_parameters()}

    def loss(x, y, n):
        weights, kl = {}, 0.0
        for k in mus:
            sd = F.softplus(rhos[k])
            weights[k] = mus[k] + sd * torch.randn_like(sd)
            kl = kl + 0.5 * (sd.pow(2) + mus[k].pow(2) - 1 - 2 * sd.log()).sum()
        return nll(functional_call(net, weights, (x,)), y) * (n / len(x)) + kl

    return loss, [*mus.values(), *rhos.values()]


def bbb(net, fused: bool | None = None):
    """The hand-written Bayes-by-Backprop step (:func:`bbb_loss`) with torch's Adam (``fused``
    as torch takes it). Returns ``step(x, y, n)``, the optimiser and the parameter count."""
    loss, params = bbb_loss(net)
    opt = torch.optim.Adam(params, lr=1e-3, fused=fused)

    def step(x, y, n):
        opt.zero_grad(set_to_none=True)
        loss(x, y, n).backward()
        opt.step()

    return step, opt, sum(p.numel() for p in params)


def hand_bbb_step(net, x, y):
    """The hand-written Bayes-by-Backprop step (:func:`bbb`) on the fixed minibatch."""
    step, _, count = bbb(net)
    return (lambda: step(x, y, N_TRAIN)), count


def pyro_autonormal_step(net, x, y):
    model = bayesian_model(net, y)
    model.to(x.device)
    scaled = zoo.ElboScale(data_scale=N_TRAIN / len(x))(model)
    guide = AutoNormal(scaled, init_scale=0.01)
    svi = SVI(scaled, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO(max_plate_nesting=1))
    svi.step(x, y)
    return (lambda: svi.step(x, y)), sum(p.numel() for p in guide.parameters())


def pyro_jit_step(net, x, y):
    """The zoo diagonal guide under Pyro's own compiled route: ``SVI`` with ``JitTrace_ELBO``
    (the whole loss traced once by ``torch.jit.trace``, then replayed)."""
    model = bayesian_model(net, y)
    model.to(x.device)
    scaled = zoo.ElboScale(data_scale=N_TRAIN / len(x))(model)
    guide = guides.get("diagonal")(model)
    with torch.no_grad():
        guide(x, y)
    elbo = JitTrace_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
    svi = SVI(scaled, guide, pyro.optim.Adam({"lr": 1e-3}), elbo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values in the graph
        svi.step(x, y)  # compiles
    return (lambda: svi.step(x, y)), guide.num_variational_parameters()


def bayesian_torch(net, device):
    """bayesian-torch's conversion of ``net`` (the same prior and initial scales as
    :func:`bbb`): ``step(x, y, n)`` and the parameter count. Raises ``ImportError`` without
    it."""
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
    bnn.to(device)
    opt = torch.optim.Adam(bnn.parameters(), lr=1e-3)

    def step(x, y, n):
        opt.zero_grad(set_to_none=True)
        out = bnn(x)
        loss = nll(out, y) * (n / len(x)) + get_kl_loss(bnn)
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in bnn.parameters())


def bayesian_torch_step(net, x, y):
    step, count = bayesian_torch(net, x.device)
    return (lambda: step(x, y, N_TRAIN)), count


# ---- zoo.fit ----------------------------------------------------------------------------
class ZooStep:
    """Runs zoo.fit on one batch repeatedly; step times come from inside its loop."""

    def __init__(self, net, x, y, family, options, device, **fit_options):
        self.model = bayesian_model(net, y)
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
        """``steps`` steady steps of one fit, each timed between two callbacks (on CUDA, each
        callback waits for the device first: every step pays the host's read of its loss)."""
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
            **grouped(
                {"progress": False, "callbacks": [stamp], "device": self.device, **self.fit_options}
            ),
        )
        self.times += [b - a for a, b in zip(stamps[:-1], stamps[1:])]


#: The zoo.fit rows: name -> (family, guide options, fit options).
ZOO_ROWS = {
    "zoo diagonal": ("diagonal", {}, {}),
    "zoo tridiagonal posch": ("tridiagonal", {}, {}),
    "zoo tridiagonal free": ("tridiagonal", {"parameterization": "free"}, {}),
    "zoo lowrank r=10": ("lowrank", {"rank": 10}, {}),
    "zoo matrix normal": ("matrix_normal", {}, {}),
    "zoo block diagonal b=16": ("block_diagonal", {}, {}),
    # one mask per step (the family's default is a mask per example, the "local" rows)
    "zoo MC dropout p=0.1": ("mc_dropout", {}, {"estimator": "reparam"}),
    "zoo MC dropout, local reparam. (a mask per example)": (
        "mc_dropout",
        {},
        {"estimator": "local"},
    ),
    "zoo MC dropout, closed-form KL": (
        "mc_dropout",
        {},
        {"elbo": "meanfield", "estimator": "reparam"},
    ),
    "zoo MC dropout, local reparam., closed-form KL": (
        "mc_dropout",
        {},
        {"estimator": "local", "elbo": "meanfield"},
    ),
    "zoo map (point mass)": ("map", {}, {}),
    "zoo subnetwork S=256": ("subnetwork", {"size": 256}, {}),
    "zoo subnetwork S=1024": ("subnetwork", {"size": 1024}, {}),
    "zoo subnetwork S=4096": ("subnetwork", {"size": 4096}, {}),
    "zoo whvi": ("whvi", {}, {}),
    "zoo whvi, diagonal q(g)": ("whvi", {"covariance": "diagonal"}, {}),
    "zoo whvi, local reparam. (the fast product)": ("whvi", {}, {"estimator": "local"}),
    "zoo whvi, diagonal q(g), local reparam.": (
        "whvi",
        {"covariance": "diagonal"},
        {"estimator": "local"},
    ),
    "zoo diagonal, local reparam.": ("diagonal", {}, {"estimator": "local"}),
    "zoo diagonal, flipout": ("diagonal", {}, {"estimator": "flipout"}),
    "zoo matrix normal, local reparam., closed-form KL": (
        "matrix_normal",
        {},
        {"estimator": "local", "elbo": "meanfield"},
    ),
}


def build_methods(net, x, y, device) -> dict:
    """Name -> constructor of a step function ``(step, parameter count)`` or a ZooStep."""
    methods = {
        "deterministic": lambda: deterministic_step(net, x, y),
        "hand-written BBB": lambda: hand_bbb_step(net, x, y),
        "pyro AutoNormal + SVI": lambda: pyro_autonormal_step(net, x, y),
        "pyro SVI + JitTrace_ELBO, zoo diagonal guide": lambda: pyro_jit_step(net, x, y),
    }
    try:
        import bayesian_torch  # noqa: F401

        methods["bayesian-torch"] = lambda: bayesian_torch_step(net, x, y)
    except ImportError:
        print("bayesian-torch is not installed: its row is left out")
    zoo_rows = dict(ZOO_ROWS)
    if (
        device.type == "cuda"
    ):  # the default replays a CUDA graph (zoo.training.cuda_graph); without it:
        zoo_rows["zoo diagonal, no CUDA graph"] = ("diagonal", {}, {"cuda_graph": False})
        for name in ("zoo tridiagonal posch", "zoo lowrank r=10", "zoo matrix normal"):
            family, options, fit_options = zoo_rows[name]
            zoo_rows[f"{name}, no CUDA graph"] = (
                family,
                options,
                {**fit_options, "cuda_graph": False},
            )
    weights = sum(p.numel() for p in net.parameters())
    for name, (family, options, fit_options) in zoo_rows.items():
        if options.get("size", 0) > weights:  # a subnetwork larger than the network
            print(f"{name}: more than the network's {weights:,} weights: its row is left out")
            continue
        methods[name] = lambda f=family, o=options, k=fit_options: ZooStep(
            net, x, y, f, o, device, **k
        )
    return methods


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="zoo.fit step time against the floor and peers")
    parser.add_argument("--net", default="mlp", choices=NETS)
    parser.add_argument(
        "--batch-size", type=int, default=None, help="default: 128 (mlp, lenet5), 32 (tiny)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=20, help="steps per method per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--only", nargs="+", default=None, help="time only methods whose name contains one of these"
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/step_time.json")
    args = parser.parse_args()
    if args.batch_size is None:
        args.batch_size = BATCH_SIZES[args.net]
    return args


def time_round(methods: dict, zoo_steps: dict, times: dict, steps: int, device) -> None:
    """One block of ``steps`` steps of every method, appended to ``times[name]``: each step timed
    alone, the device waited for at its end (as ``ZooStep.run`` times zoo.fit's steps)."""
    for name, (step, _) in methods.items():
        sync(device)
        for _ in range(steps):
            t = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - t)
    for name, runner in zoo_steps.items():
        runner.times = []
        runner.run(steps)
        times[name] += runner.times


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pyro.set_rng_seed(0)
    net, shape = make_net(args.net)
    net.to(device)
    x = torch.randn((args.batch_size,) + shape, device=device)
    if args.net == "tiny":
        y = torch.randn(args.batch_size, device=device)
    else:
        y = torch.randint(0, 10, (args.batch_size,), device=device)
    with suite.record("step_time", args.out):
        measure(args, net, x, y, device)


def measure(args, net, x, y, device) -> None:
    """Build every method, time them in interleaved rounds and print the table."""
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
    for step, _ in methods.values():  # warm-up
        for _ in range(3):
            step()
    idle = defaultdict(list)
    for _ in range(args.rounds):
        time_round(methods, zoo_steps, idle, args.steps, device)
    counts = {name: n for name, (_, n) in methods.items()}
    counts.update({name: r.guide.num_variational_parameters() for name, r in zoo_steps.items()})
    load = os.getloadavg()[0]
    print(
        f"\n{args.net}, batch {args.batch_size}, {device}, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds x {args.steps} steps, medians; load {load:.2f} (1-minute average)\n"
    )
    print_table(idle, counts)


def check_times(*tables: dict) -> None:
    """Refuse to print a time that cannot be one: zero, negative or not finite."""
    for times in tables:
        for name, values in times.items():
            med = statistics.median(values)
            if not (math.isfinite(med) and med > 0):
                raise SystemExit(f"{name}: the measured step time is {med!r} s; not printed")


def print_table(times: dict, counts: dict) -> None:
    check_times(times)
    floor = statistics.median(times["hand-written BBB"])
    diag = statistics.median(times["zoo diagonal"])
    print("| method | ms / step | x hand-written BBB | x zoo diagonal | parameters |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"| {name} | {1e3 * med:.2f} | {med / floor:.2f} | {med / diag:.2f} "
              f"| {counts[name]:,} |")  # fmt: skip


if __name__ == "__main__":
    main()
