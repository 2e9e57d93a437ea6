"""Time one SVI step of zoo.fit per family against hand-written and peer implementations.

    python benchmarks/step_time.py                      # MLP 784-400-400-10, batch 128, CPU
    python benchmarks/step_time.py --net lenet5         # LeNet-5
    python benchmarks/step_time.py --device cuda        # same script on a GPU

All methods run in one process, interleaved in blocks (every method runs a block of steps, then
the next method, for several rounds), and the table reports the median step time as a ratio to
the hand-written Bayes-by-Backprop step (diagonal Gaussian, analytic KL, written below as the
floor to approach). bayesian-torch is timed when it is installed (``pip install bayesian-torch``;
it is not a dependency of the project).
"""

from __future__ import annotations

import argparse
import copy
import statistics
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

    def __init__(self, net, x, y, family, options, device):
        self.model = zoo.models.BayesianModel(copy.deepcopy(net), task="classification")
        self.data = (x, y)
        self.device = device
        # The data are one batch of a 60,000-example set: scale the likelihood as fit would.
        self.model.to(device)
        self.guide = guides.get(family)(self.model, **options)
        with torch.no_grad():
            self.guide(x, y)
        self.times: list[float] = []

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
        )
        self.times += [b - a for a, b in zip(stamps[:-1], stamps[1:])]


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pyro.set_rng_seed(0)
    net, shape = make_net(args.net)
    net.to(device)
    x = torch.randn((args.batch_size,) + shape, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    methods = {
        "deterministic": deterministic_step(net, x, y),
        "hand-written BBB": hand_bbb_step(net, x, y),
        "pyro AutoNormal + SVI": pyro_autonormal_step(net, x, y),
    }
    try:
        methods["bayesian-torch"] = bayesian_torch_step(net, x, y)
    except ImportError:
        print("bayesian-torch is not installed: its row is left out")
    zoo_steps = {
        "zoo diagonal": ZooStep(net, x, y, "diagonal", {}, device),
        "zoo tridiagonal posch": ZooStep(net, x, y, "tridiagonal", {}, device),
        "zoo tridiagonal free": ZooStep(
            net, x, y, "tridiagonal", {"parameterization": "free"}, device
        ),
        "zoo lowrank r=10": ZooStep(net, x, y, "lowrank", {"rank": 10}, device),
        "zoo matrix normal": ZooStep(net, x, y, "matrix_normal", {}, device),
    }
    if args.only:
        keep = lambda name: name == "hand-written BBB" or any(k in name for k in args.only)  # noqa: E731
        methods = {k: v for k, v in methods.items() if keep(k)}
        zoo_steps = {k: v for k, v in zoo_steps.items() if keep(k) or k == "zoo diagonal"}
    times = defaultdict(list)
    for step, _ in methods.values():  # warm-up
        for _ in range(3):
            step()
    for _ in range(args.rounds):
        for name, (step, _) in methods.items():
            for _ in range(args.steps):
                sync(device)
                t = time.perf_counter()
                step()
                sync(device)
                times[name].append(time.perf_counter() - t)
        for runner in zoo_steps.values():
            runner.run(args.steps)
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
    print("| method | ms / step | x hand-written BBB | x zoo diagonal | parameters |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, values in times.items():
        med = statistics.median(values)
        print(
            f"| {name} | {1e3 * med:.2f} | {med / floor:.2f} | {med / diag:.2f} "
            f"| {counts[name]:,} |"
        )


if __name__ == "__main__":
    main()
