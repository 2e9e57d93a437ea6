"""No operation that waits for the host in any family's compiled loss (a CUDA graph cannot
capture one): a CPU scan of each compiled graph against a denylist, and for a conversion to a
Python number of anything computed from the parameters or data, so that a family cannot bring one
back unnoticed. The list was checked on an H100: ``torch.linalg.cholesky`` in the
low-rank family failed a CUDA-graph capture with ``cudaErrorStreamCaptureUnsupported`` (issue
36); ``cholesky_ex`` does not check the factor on the host."""

import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import guides
import zoo
import zoo.inference.backends
import zoo.inference.compiled
from tests.families import CASES

#: Operations that copy a device value to the host, or whose output shape depends on values.
SYNCHRONISING = {
    "aten::linalg_cholesky",
    "aten::cholesky",
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::nonzero",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique2",
}


#: Conversions of a 0-d tensor to a Python number: free when the tensor holds a size (the
#: tracer records shape arithmetic on such tensors), a copy from the device when it holds data.
SCALAR_READS = {
    "aten::Int",
    "aten::Float",
    "aten::Bool",
    "aten::ScalarImplicit",
    "aten::IntImplicit",
    "aten::FloatImplicit",
}
#: Operations that read only a tensor's shape, never its values.
SHAPE_READS = {"aten::size", "aten::numel", "aten::dim", "prim::shape"}


def nodes(graph):
    for node in graph.nodes():
        yield node
        for block in node.blocks():
            yield from nodes(block)


def node_kinds(graph) -> set[str]:
    return {node.kind() for node in nodes(graph)}


def data_scalar_reads(graph) -> list[str]:
    """Scalar conversions (:data:`SCALAR_READS`) whose tensor depends on the values of a graph
    input (parameters, data), not only on shapes: each one waits for the device."""
    tainted = {value.debugName() for value in graph.inputs()}
    found = []
    for node in nodes(graph):
        inputs = {value.debugName() for value in node.inputs()}
        if node.kind() in SCALAR_READS and inputs & tainted:
            found.append(str(node).strip())
        if node.kind() not in SHAPE_READS and inputs & tainted:
            tainted |= {value.debugName() for value in node.outputs()}
    return found


def test_the_scan_finds_a_read_of_data_and_passes_a_read_of_a_shape():
    def reads_data(x):
        return torch.full((2,), x.sum())

    def reads_shape(x):
        return torch.zeros(x.shape[0] * 2) + x[:1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.trace, as zoo.inference.compiled
        graphs = [torch.jit.trace(f, torch.randn(3)).graph for f in (reads_data, reads_shape)]
    assert len(data_scalar_reads(graphs[0])) == 1
    assert "aten::Int" in node_kinds(graphs[1]) and data_scalar_reads(graphs[1]) == []


@pytest.mark.parametrize("estimator", ["reparam", "local", "flipout"])
@pytest.mark.parametrize("family,options", list(CASES.values()), ids=list(CASES))
def test_no_compiled_loss_waits_for_the_host(family, options, estimator):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
    model = zoo.models.LeNet5(hidden=8)
    guide = guides.get(family)(model, **options)
    objective = zoo.Objective(model, guide, estimator=estimator, jit=True)
    try:
        objective.setup(x, y)
    except ValueError as err:  # an estimator this family does not serve: zoo.fit refuses it
        if "serves no weight" not in str(err):
            raise
        pytest.skip(f"estimator={estimator!r} serves no site of {family}")
    objective.loss(x, y, 1000)  # the first step is eager (Pyro's validation)
    graph = objective.backend.function_for(x, y, 1000 / len(x), 1.0)
    assert graph is not None, objective.jit_state
    found = node_kinds(graph.graph) & SYNCHRONISING
    assert not found, f"{family} {options} ({estimator}): {sorted(found)}"
    reads = data_scalar_reads(graph.graph)
    assert not reads, f"{family} {options} ({estimator}) reads a device value: {reads[:3]}"


class HostReads(TorchDispatchMode):
    """The operations of an eager evaluation in :data:`SYNCHRONISING` (a copy of a value to
    the host, an output shape that depends on values, a Cholesky that checks its factor on the
    host: each one waits for the device on a GPU)."""

    READS = {kind.removeprefix("aten::") for kind in SYNCHRONISING}  # the graphs' denylist

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in self.READS:
            self.found.append(str(func))
        elif name == "lift_fresh" and (where := _library_frame()):
            self.found.append(f"a tensor made from Python data at {where}")  # a host copy
        return func(*args, **(kwargs or {}))


def _library_frame() -> str | None:
    """Where the caller's stack leaves torch, if that frame is in the repository's ``guides/``
    or ``zoo/`` (Pyro's own empty CPU tensors, and a test's, are not counted)."""
    for frame in reversed(traceback.extract_stack()[:-2]):  # this function and the mode's
        path = Path(frame.filename).resolve()
        if TORCH in path.parents or frame.name == "__torch_function__":  # (an estimator's mode)
            continue
        if REPO in path.parents and path.relative_to(REPO).parts[0] in ("guides", "zoo"):
            return f"{path.relative_to(REPO)}:{frame.lineno}"
        return None
    return None


TORCH = Path(torch.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[3]


def test_host_reads_are_counted():
    library = SimpleNamespace(dtype=torch.float32)  # a backend makes a graph's scales so
    with HostReads() as reads:
        float(torch.randn(3).sum())
        torch.randn(4).nonzero()
        torch.tensor(0.5)  # made here, in a test: not counted
        zoo.inference.backends.LossBackend.scales(library, torch.zeros(1), 2.0, 1.0)
    assert len(reads.found) == 3, reads.found
    assert reads.found[2].startswith("a tensor made from Python data at zoo/inference/backends.py:")


@pytest.mark.parametrize("estimator", ["reparam", "local", "flipout"])
@pytest.mark.parametrize("family, options", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("elbo", ["trace", "meanfield"])
def test_no_eager_loss_waits_for_the_host(family, options, estimator, elbo):
    """The eager loss (a GPU step that is not captured: the first, a refused graph, the last
    small batch) and its backward read nothing back: Pyro's ``Trace_ELBO`` reads every site's
    log-density with ``.item()``; ``zoo.inference.surrogate`` does not. Nor does the library make a
    tensor from Python data in a step (on a GPU, a copy from the host: MC dropout's bias scale
    was one per site)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, generator=g), torch.randint(0, 3, (16,), generator=g)
    model = zoo.models.BayesianMLP(3, (8,), 3, task="classification")
    guide = guides.get(family)(model, **options)
    objective = zoo.Objective(model, guide, estimator=estimator, elbo=elbo, jit=False)
    try:
        objective.setup(x, y)
    except ValueError as err:
        if "serves no weight" not in str(err):
            raise
        pytest.skip(f"estimator={estimator!r} serves no site of {family}")
    objective.loss(x, y, 1000, validate=True)  # the first step: Pyro's checks read values
    with HostReads() as reads:
        objective.loss(x, y, 1000, step=1).backward()
    assert not reads.found, f"{family} {options} ({estimator}, {elbo}): {reads.found[:5]}"
