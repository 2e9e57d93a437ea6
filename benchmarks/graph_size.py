"""How big each family's compiled loss is, and what its loss and gradients cost, on a small net.

On a small network the compiled step (``zoo.compiled``) is a sequence of small tensor operations,
each costing a fixed few microseconds on the CPU whatever its size, so a family's step time
follows the length of its graph. For every family this prints the tensor operations in the
forward graph traced by ``jit=True`` (shape bookkeeping and constants left out), the Python calls
left in it (custom ``autograd.Function``s, which call back into Python forward and backward), and
the median time of one loss and backward pass through it (no optimiser, no fit loop), with both as
ratios to the diagonal family, measured side by side in interleaved rounds.

    python benchmarks/graph_size.py               # the 13-50-1 regression net, batch 32
    python benchmarks/graph_size.py --net mlp     # 784-400-400-10, batch 128
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

import guides
import zoo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import NETS, ZOO_ROWS, bayesian_model, make_net  # noqa: E402  (the same nets)

#: (label, family, guide options): step_time.py's zoo rows with the default estimator and ELBO.
ROWS = [
    (name.removeprefix("zoo "), family, options)
    for name, (family, options, fit_options) in ZOO_ROWS.items()
    if not fit_options
]
#: Graph nodes that are bookkeeping, not tensor work.
BOOKKEEPING = {
    "prim::Constant",
    "prim::ListConstruct",
    "prim::ListUnpack",
    "prim::TupleConstruct",
    "prim::TupleUnpack",
    "prim::NumToTensor",
    "aten::size",
    "aten::Int",
    "aten::ScalarImplicit",
}


def graph_counts(objective: zoo.Objective, x, y) -> tuple[int, int]:
    """(tensor operations, Python calls) in the forward graph of ``objective``'s compiled loss."""
    graph = objective.compiled.graph_for(x, y, 60000 / len(x), 1.0)
    kinds = collections.Counter(node.kind() for node in graph.graph.nodes())
    ops = sum(n for kind, n in kinds.items() if kind not in BOOKKEEPING)
    return ops, kinds["prim::PythonOp"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="tiny", choices=NETS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--passes", type=int, default=50, help="loss+backward passes per round")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as zoo.fit runs a small step (threads="auto")
    try:
        run(args)
    finally:
        torch.set_num_threads(threads)


def run(args) -> None:
    torch.manual_seed(0)
    net, shape = make_net(args.net)
    batch = 32 if args.net == "tiny" else 128
    x = torch.randn((batch,) + shape)
    y = torch.randn(batch) if args.net == "tiny" else torch.randint(0, 10, (batch,))
    objectives, counts = {}, {}
    for label, family, options in ROWS:
        model = bayesian_model(net, y)
        objective = zoo.Objective(model, guides.get(family)(model, **options), jit=True)
        objective.setup(x, y)
        objectives[label], counts[label] = objective, graph_counts(objective, x, y)
    times = {label: [] for label in objectives}
    for _ in range(args.rounds):
        for label, objective in objectives.items():
            params = objective.compiled.params
            start = time.perf_counter()
            for _ in range(args.passes):
                for p in params:
                    p.grad = None
                objective.loss(x, y, 60000).backward()
            times[label].append((time.perf_counter() - start) / args.passes * 1e3)
    median = {label: sorted(t)[len(t) // 2] for label, t in times.items()}
    load = os.getloadavg()[0]
    print(
        f"\n{args.net}, batch {batch}, CPU, 1 thread, {args.rounds} rounds x {args.passes} "
        f"passes, medians; load {load:.2f} (1-minute average)\n"
    )
    print(
        "| family | tensor ops (forward graph) | Python calls | x diagonal, ops "
        "| loss + backward, ms | x diagonal, time |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    ops0, t0 = counts["diagonal"][0], median["diagonal"]
    for label in objectives:
        ops, calls = counts[label]
        print(
            f"| {label} | {ops} | {calls} | {ops / ops0:.2f} | {median[label]:.3f} "
            f"| {median[label] / t0:.2f} |"
        )


if __name__ == "__main__":
    main()
