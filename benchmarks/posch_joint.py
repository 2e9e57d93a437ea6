"""Posch sites drawn one by one or jointly (``guides.posch_joint``): time and operations of a
draw, its log-density and their backward, across network sizes.

    python benchmarks/posch_joint.py                      # CPU, 8 sites, 4k .. 512k weights
    python benchmarks/posch_joint.py --device cuda
    python benchmarks/posch_joint.py --sites 4 --threads 1

For each total size ``N`` (split evenly over the sites), each cell is the median over
interleaved rounds of one draw of every site, ``sum log q + sum w`` and its backward:

- per site: the ratio sequences in one table, then each site's own draw (the hand-written
  ``PoschSample`` kernel);
- joint: :func:`guides.posch_joint.posch_joint_draw` over all of them;

both through :func:`guides.posch_joint.share_posch_work`, as ``AutoTridiagonal`` runs them.

"ops" counts the tensor operations dispatched for one pass (forward and backward, views left
out; ``graph_size.dispatched_ops``): on a GPU each is a kernel launch, so it is what a CUDA-graph
replay pays. The ratio column is what :func:`guides.posch_joint.joint_draw_pays` decides on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from guides.families.tridiagonal import PoschSite
from guides.posch_joint import CPU_JOINT_ELEMENTS_PER_SITE, joint_draw_pays, share_posch_work

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_size import dispatched_ops  # noqa: E402  (the same count)


def make_sites(total: int, count: int, device: str) -> list[PoschSite]:
    g = torch.Generator().manual_seed(0)
    sizes = [total // count] * count
    return [PoschSite(torch.randn(n, generator=g) * 0.1, 0.01).to(device) for n in sizes]


def one_pass(sites: list[PoschSite], layouts: dict, joint: bool) -> torch.Tensor:
    """``sum log q + sum w`` of one draw of every site, the guide's way."""
    share_posch_work(sites, sites[0].min_abs_mean, layouts, joint=joint)
    total = 0.0
    try:
        for site in sites:
            d = site.distribution()
            w = d.rsample()
            total = total + d.log_prob(w) + w.sum()
    finally:
        for site in sites:
            site.shared = None
    return total


def pass_of(sites: list[PoschSite], joint: bool):
    """One pass forward and backward, gradients cleared first."""
    params = [p for s in sites for p in s.parameters()]
    layouts: dict = {}

    def step():
        for p in params:
            p.grad = None
        one_pass(sites, layouts, joint).backward()

    return step


def timed(step, reps: int, device: str) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    step()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    sync()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sites", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2**k * 1000 for k in range(2, 10)])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run(args)
    finally:
        torch.set_num_threads(threads)


def run(args) -> None:
    device = torch.device(args.device)
    rows = []
    for total in args.sizes:
        sites = make_sites(total, args.sites, args.device)
        methods = {
            "per site": pass_of(sites, joint=False),
            "joint": pass_of(sites, joint=True),
        }
        times = {name: [] for name in methods}
        for _ in range(args.rounds):
            for name, method in methods.items():
                times[name].append(timed(method, args.reps, args.device))
        ops = {name: dispatched_ops(method) for name, method in methods.items()}
        med = {name: statistics.median(t) for name, t in times.items()}
        rows.append((total, med, ops, joint_draw_pays(total, args.sites, device)))
    print(
        f"\n{args.sites} Posch sites on {args.device}, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds x {args.reps} passes, medians; "
        f"load {os.getloadavg()[0]:.2f} (1-minute average); CPU_JOINT_ELEMENTS_PER_SITE = "
        f"{CPU_JOINT_ELEMENTS_PER_SITE}\n"
    )
    print(
        "| weights | per site ms | joint ms | joint / per site | per site ops | joint ops | rule |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for total, med, ops, joint in rows:
        ratio = med["joint"] / med["per site"]
        print(
            f"| {total:,} | {med['per site']:.3f} | {med['joint']:.3f} | {ratio:.2f} "
            f"| {ops['per site']} | {ops['joint']} | {'joint' if joint else 'per site'} |"
        )


if __name__ == "__main__":
    main()
