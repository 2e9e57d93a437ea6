"""How big each family's compiled loss is, and what its loss and gradients cost, on a small net.

On a small network the compiled step (``zoo.inference.compiled``) is a sequence of small tensor
operations, each costing a fixed few microseconds on the CPU whatever its size, so a family's step
time follows the length of its graph. For every family this prints the tensor operations in the
forward graph traced by ``jit=True`` (shape bookkeeping and constants left out), the Python calls
left in it (custom ``autograd.Function``s, which call back into Python forward and backward), the
tensor operations dispatched by one loss and backward pass (forward and backward; views left out:
on a GPU each is a kernel, so this is what a CUDA-graph replay of the step pays), and the median
time of that pass (no optimiser, no fit loop), with the counts and the time as ratios to the
diagonal family, measured side by side in interleaved rounds. One more column counts the values
one eager loss and backward pass reads back to the host (``.item()`` and the like: on a GPU each
waits for the device; the eager loss runs where no graph does, as on the first step). The
graphs are the re-planned ones a GPU runs (``zoo.inference.compiled.OPTIMISED_EXECUTION``; a CPU
fit runs the traced order), so the counts are a GPU step's.

Two families take another path on the CPU than on a GPU: the Posch tridiagonal draws its sites
jointly on a GPU and, on the CPU, only on small networks (``guides.posch_joint.joint_draw_pays``),
and the matrix normal splits a factor of 256 rows or more into diagonal blocks on the CPU only
(``guides.kernels.diagonal_blocks``). The rows "tridiagonal posch, joint" and "matrix normal, one
block" force a GPU's path, so that the CPU shows the operations a GPU runs. The last row is the
hand-written Bayes-by-Backprop loss of ``step_time.py`` (eager, analytic KL), the floor that
issue 36's targets measure the diagonal family against; it has no graph.

    python benchmarks/graph_size.py               # the 13-50-1 regression net, batch 32
    python benchmarks/graph_size.py --net lenet5  # LeNet-5, batch 128
    python benchmarks/graph_size.py --only diagonal "lowrank r=10"  # some rows (the diagonal's
                                                                    # always: the ratios need it)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time
from collections.abc import Callable
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import guides
import guides.families.matrix_normal
import guides.families.tridiagonal
import guides.posch_joint
import zoo
import zoo.inference.compiled

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import NETS, ZOO_ROWS, bayesian_model, bbb_loss, make_net  # noqa: E402

#: (label, family, guide options): step_time.py's zoo rows under ``zoo.Objective``'s defaults
#: (one shared draw per step, ``Trace_ELBO``): those given no fit option, or only that draw.
ROWS = [
    (name.removeprefix("zoo "), family, options)
    for name, (family, options, fit_options) in ZOO_ROWS.items()
    if fit_options in ({}, {"estimator": "reparam"})
    and name not in ("zoo subnetwork S=1024", "zoo subnetwork S=4096")
]  # the larger subnetworks hold every weight of the small net: the same operations as S=256
#: Rows run on a GPU's path (:func:`gpu_path`).
GPU_PATH_ROWS = {
    "tridiagonal posch, joint": ("tridiagonal", {}),
    "matrix normal, one block": ("matrix_normal", {}),
}
#: The hand-written Bayes-by-Backprop row.
HAND_ROW = "hand-written BBB (analytic KL)"
#: Dispatched operations that move no data.
VIEWS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::expand",
    "aten::expand_as", "aten::slice", "aten::select", "aten::t", "aten::transpose", "aten::mT",
    "aten::mH", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::detach",
    "aten::alias", "aten::_unsafe_view", "aten::unflatten", "aten::flatten", "aten::split",
    "aten::unbind", "aten::diagonal", "aten::narrow", "aten::empty", "aten::empty_like",
    "aten::empty_strided", "aten::result_type", "aten::size", "aten::numel", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::item", "aten::_local_scalar_dense",
    "aten::broadcast_tensors", "aten::real", "aten::to", "aten::_to_copy", "aten::type_as",
    "aten::contiguous", "aten::view_as",
}  # fmt: skip
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
    graph = objective.backend.function_for(x, y, 60000 / len(x), 1.0)
    kinds = collections.Counter(node.kind() for node in graph.graph.nodes())
    ops = sum(n for kind, n in kinds.items() if kind not in BOOKKEEPING)
    return ops, kinds["prim::PythonOp"]


def dispatched_ops(step: Callable[[], object]) -> int:
    """Tensor operations that one call of ``step`` dispatches from Python, the TorchScript
    interpreter or autograd (an operation called inside another is part of it), views and
    shape reads (:data:`VIEWS`) left out. ``aten::item`` on a shape is left out too: the
    tracer's size arithmetic runs on the host (tests/zoo/training/test_host_sync.py checks that no
    item reads data)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    count = 0
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None and event.name.startswith("aten::") and event.name not in VIEWS:
            count += 1
    return count


#: Operations that copy a value to the host or whose output shape depends on values.
HOST_READS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2"}


class _HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.__name__.split(".")[0] in HOST_READS
        return func(*args, **(kwargs or {}))


def host_reads(step: Callable[[], object]) -> int:
    """Operations of one call of ``step`` that read a value back to the host
    (:data:`HOST_READS`)."""
    with _HostReads() as reads:
        step()
    return reads.count


@contextlib.contextmanager
def gpu_path(forced: bool):
    """Within this block, if ``forced``, the families take the path they take on a GPU: the
    Posch sites are drawn jointly and the matrix normal's factors are not split into blocks."""
    if not forced:
        yield
        return
    with (
        mock.patch.object(
            guides.posch_joint, "joint_draw_pays", lambda elements, sites, device: True
        ),
        mock.patch.object(guides.families.matrix_normal, "diagonal_blocks", lambda n, device: 1),
    ):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="tiny", choices=NETS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--passes", type=int, default=50, help="loss+backward passes per round")
    parser.add_argument("--only", nargs="+", metavar="ROW", help="rows to run (by label)")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as zoo.fit runs a small step (threads="auto")
    plans = dict(zoo.inference.compiled.OPTIMISED_EXECUTION)
    zoo.inference.compiled.OPTIMISED_EXECUTION["cpu"] = True  # the graph a GPU replays
    try:
        run(args)
    finally:
        torch.set_num_threads(threads)
        zoo.inference.compiled.OPTIMISED_EXECUTION.update(plans)


def run(args) -> None:
    torch.manual_seed(0)
    net, shape = make_net(args.net)
    batch = 32 if args.net == "tiny" else 128
    x = torch.randn((batch,) + shape)
    y = torch.randn(batch) if args.net == "tiny" else torch.randint(0, 10, (batch,))
    rows = [(label, family, options, False) for label, family, options in ROWS]
    rows += [(label, family, options, True) for label, (family, options) in GPU_PATH_ROWS.items()]
    if args.only:
        known = {row[0] for row in rows} | {HAND_ROW}
        unknown = set(args.only) - known
        if unknown:
            raise SystemExit(f"--only: no row {sorted(unknown)}; the rows are {sorted(known)}")
        rows = [row for row in rows if row[0] in {"diagonal", *args.only}]
    passes, counts, forced, reads = {}, {}, {}, {}
    for label, family, options, forced_path in rows:
        with gpu_path(forced_path):
            model = bayesian_model(net, y)
            objective = zoo.Objective(model, guides.get(family)(model, **options), jit=True)
            objective.setup(x, y, batch_size=batch)
            step = loss_and_backward(objective, x, y)
            step()  # the first pass is eager (Pyro's validation), the second compiles
            step()
            counts[label] = (*graph_counts(objective, x, y), dispatched_ops(step))
            reads[label] = host_reads(loss_and_backward(objective, x, y, eager=True))
        passes[label], forced[label] = step, forced_path
    if not args.only or HAND_ROW in args.only:
        step = hand_written_pass(net, x, y)
        step()
        counts[HAND_ROW] = (None, None, dispatched_ops(step))
        reads[HAND_ROW] = host_reads(step)
        passes[HAND_ROW], forced[HAND_ROW] = step, False
    times = {label: [] for label in passes}
    for _ in range(args.rounds):
        for label, step in passes.items():
            with gpu_path(forced[label]):
                start = time.perf_counter()
                for _ in range(args.passes):
                    step()
                times[label].append((time.perf_counter() - start) / args.passes * 1e3)
    median = {label: sorted(t)[len(t) // 2] for label, t in times.items()}
    load = os.getloadavg()[0]
    print(
        f"\n{args.net}, batch {batch}, CPU, 1 thread, {args.rounds} rounds x {args.passes} "
        f"passes, medians; load {load:.2f} (1-minute average)\n"
    )
    print(
        "| family | tensor ops (forward graph) | Python calls | ops dispatched, loss + backward "
        "| x diagonal, dispatched | host reads, eager pass | loss + backward, ms "
        "| x diagonal, time |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    d0, t0 = counts["diagonal"][2], median["diagonal"]
    for label in passes:
        ops, calls, dispatched = (c if c is not None else "-" for c in counts[label])
        print(
            f"| {label} | {ops} | {calls} | {dispatched} | {dispatched / d0:.2f} | {reads[label]} "
            f"| {median[label]:.3f} | {median[label] / t0:.2f} |"
        )


def backward_pass(params, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """One loss and backward pass: ``params``' gradients cleared, then ``loss().backward()``."""

    def step():
        for p in params:
            p.grad = None
        loss().backward()

    return step


def hand_written_pass(net, x, y) -> Callable[[], None]:
    """One loss and backward pass of the hand-written Bayes-by-Backprop loss."""
    loss, params = bbb_loss(net)
    return backward_pass(params, lambda: loss(x, y, 60000))


def loss_and_backward(objective: zoo.Objective, x, y, eager: bool = False) -> Callable[[], None]:
    """One loss and backward pass of ``objective`` (a data set of 60,000 examples), through the
    re-planned graph a GPU runs (:func:`main` sets the CPU's plan to it for this script;
    ``eager``: without its graph)."""
    return backward_pass(
        objective.backend.params,
        lambda: objective.loss(x, y, 60000, eager=eager),
    )


if __name__ == "__main__":
    main()
