"""The traced loss backend: Pyro's ELBO traced once by TorchScript's tracer and replayed.

A step of the eager loss runs Pyro's two traces, a distribution object and a log-density per
site, and the ELBO's bookkeeping in Python: for a small network that host work is most of the
step. :class:`TracedLoss` (a :class:`~zoo.inference.backends.LossBackend`) records the tensor
operations of one evaluation (guide draws, model, log-densities, the sum) as a TorchScript graph
and replays it: the same operations in the same order, without the Python around them.

What is traced is the loss of :mod:`zoo.inference.surrogate` (Pyro's ``Trace_ELBO`` or
``TraceMeanField_ELBO``, reduced with one sum per scale): for a guide whose sites are all
reparameterised (every family in ``guides``) it is the ``-ELBO`` estimate and the surrogate
whose gradient Pyro's ``SVI`` follows at once, so the traced loss equals the eager one in value
and gradient, for the same random draws (the graph's random operations draw from torch's
generators in the eager order). Inputs of the graph: every optimised parameter (guide and
model), the minibatch, and the two scales of :mod:`zoo.inference.elbo` (``N / B`` and the KL
weight), so a schedule of KL weights needs no new graph; a new minibatch shape compiles one
more, except the last, smaller batch of an epoch, which :class:`zoo.Objective` evaluates eagerly
(it comes once an epoch; its graph would cost more to build than it saves).

One plan per device, fixed for a whole fit (:data:`OPTIMISED_EXECUTION`). On the CPU a graph
runs in the traced order (``torch.jit.optimized_execution(False)``): it replays the eager loss's
operations and their autograd backward, so a seeded fit's values and gradients are the eager
fit's to the bit. On CUDA it runs re-planned by TorchScript's graph executor (the backward
differentiated symbolically, elementwise kernels fused), which pays on a GPU; on the CPU the
re-planning costs more start-up than it saves for most families (``benchmarks/executor_order.py``
at ``6309d99`` measures both plans).

The re-planned order of independent random operations can differ from the traced one (the
block-diagonal guide's noise draw moved ahead of the weights'; MC dropout's masks and
pre-activation noise under ``estimator="local"`` swapped between layers), and the graph then
evaluates the loss on other draws than the eager loss. So when a graph is built, its value is
checked once against the eager loss (the same ELBO's ``differentiable_loss``), both on the same
draws (other than the ones the trace saw), after ``CHECK_RUNS`` runs of a re-planned graph (the
executor optimises a graph after its first run); a re-planned graph that fails runs in the
traced order instead, and one that fails in the traced order too (a site that is not
reparameterised, a program whose Python reads tensor values the graph would freeze) is
declined: the objective evaluates that shape eagerly. :func:`compile_refusal` lists what is
never compiled.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch

from guides.base import PerSiteGuide
from zoo.inference.backends import WiredLoss
from zoo.inference.elbo import ElboScale
from zoo.models.base import BayesianModel
from zoo.runtime.rng import forked

#: Relative difference between the compiled and the eager loss above which a graph is refused.
CHECK_RTOL = 1e-4
#: Runs of a new re-planned graph before its value is checked: TorchScript's executor profiles a
#: graph on its first run and optimises it for the runs after, so the check sees the plan every
#: step runs (a graph in the traced order is checked on its first run).
CHECK_RUNS = 3
#: Per device type, whether graphs run re-planned by TorchScript's executor (``True``) or in the
#: traced order, for the whole fit (module docstring; other device types: re-planned).
OPTIMISED_EXECUTION = {"cpu": False, "cuda": True}
#: The torch releases the traced backend has been run on, the whole suite at each. TorchScript's
#: tracer is deprecated (``torch.jit.trace`` says so with a ``FutureWarning``; this module calls
#: the tracer's entry point, which does not): the day a release removes or breaks it,
#: ``tests/zoo/test_compiled.py::test_the_tracer_works_on_this_torch`` fails naming these, and
#: ``jit=False`` (the eager backend) is the way on. ``pyproject.toml`` bounds torch to them.
TRACED_ON = ("2.11", "2.14")
#: What ``TracedLoss._compile`` returns when the eager loss is not finite (nothing to compare).
UNCHECKED = object()


def compile_refusal(model, guide, num_particles: int, device=None) -> str | None:
    """Why ``model`` and ``guide`` are evaluated eagerly under ``jit="auto"`` (``None``: they
    are compiled): only ``zoo`` models with a ``guides`` family and one particle per step (the
    vectorised particles run through ``torch.func.vmap``, which ``torch.jit.trace`` cannot
    record), whose network has no running statistics to update (batch norm) and whose forward
    pass ``vmap`` could batch (one that reads tensor values could not be traced). A network with
    PyTorch's fused recurrent layers compiles on the CPU, where its traced loss takes each
    step's drawn weights as the eager one does (``tests/zoo/inference/test_compiled.py`` holds
    a fit equal to the eager one step for step); on other devices (``device``, the inputs'),
    where cuDNN's kernels and the CUDA-graph step it would open have not been measured, it
    stays eager. Without a compiled loss the CUDA graph step is off too
    (:mod:`zoo.training.rules`)."""

    if not isinstance(model, BayesianModel):
        return "the model is not a zoo.models.BayesianModel"
    if not isinstance(guide, PerSiteGuide):
        return "the guide is not a guides family (PerSiteGuide)"
    if num_particles != 1:
        return "num_particles > 1 (vectorised particles use torch.func.vmap)"
    if model._statistics:
        return "the network has batch-norm running statistics (a graph would not update them)"
    recurrent = any(isinstance(m, torch.nn.RNNBase) for m in model.net.modules())
    if recurrent and not (device is None or torch.device(device).type == "cpu"):
        return (
            "the network has PyTorch's fused recurrent layers (nn.LSTM, nn.GRU, nn.RNN), "
            "compiled on the CPU only"
        )
    if not recurrent and not model._vectorised:
        return (
            "the network's forward pass reads values vmap could not batch (a graph would "
            "freeze them)"
        )
    return None


class TracedLoss(WiredLoss):
    """The surrogate ``-ELBO`` of ``elbo`` for the wired ``model`` and ``guide``, one traced
    graph per minibatch shape.

    Parameters
    ----------
    elbo : zoo.inference.surrogate.ReparamTrace_ELBO or ReparamMeanField_ELBO
    model, guide : callable
        Already wrapped in ``scale`` (and an estimator's handlers).
    params : list of Tensor
        Every tensor the loss differentiates (guide and model parameters): graph inputs.
    scale : ElboScale
        The messenger the model and guide were wrapped in; its scales become graph inputs.
    context : callable
        ``context()`` is the context manager an evaluation runs in (``zoo.inference.objective``'s).
    """

    name = "compiled"

    def __init__(self, elbo, model, guide, params, scale: ElboScale, context: Callable):
        super().__init__(elbo, model, guide, params, scale, context)
        self.graphs: dict[tuple, ExecutorSetting | None] = {}
        self.refused = None

    def function_for(self, x: torch.Tensor, y: torch.Tensor, data_scale: float, kl_weight: float):
        """The checked graph for minibatches shaped like ``(x, y)`` (traced on first use), or
        ``None`` when it was declined, or could not be checked yet because the loss is not
        finite."""
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, x.device)
        if key not in self.graphs:
            graph = self._compile(x, y, data_scale, kl_weight, replanned(x.device))
            if graph is UNCHECKED:
                return None  # no verdict on a non-finite loss: eager now, compile again later
            self.graphs[key] = graph
        return self.graphs[key]

    def _compile(self, x, y, data_scale: float, kl_weight: float, optimised: bool):
        """A checked graph for ``(x, y)``: re-planned if ``optimised`` and its value is right,
        else in the traced order; ``None`` (with ``self.refused``) when neither matches the
        eager loss, ``UNCHECKED`` when the eager loss is not finite."""
        if optimised:
            graph = self._checked(x, y, data_scale, kl_weight, True)
            if graph is not None or (self.refused or "").startswith("torch.jit.trace failed"):
                return graph
        return self._checked(x, y, data_scale, kl_weight, False)  # the re-planned draws differ

    def _checked(self, x, y, data_scale: float, kl_weight: float, optimised: bool):
        inputs = (*self.params, x, y, *self.scales(x, data_scale, kl_weight))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # notes on Python values
            try:
                with forked(x.device), torch.jit.optimized_execution(optimised):
                    function = trace(_weak_method(self.surrogate), inputs)
                graph = ExecutorSetting(function, optimised)
                # The same draws each run; the last is checked (a traced order has no re-plan).
                for _ in range(CHECK_RUNS if optimised else 1):
                    with forked(x.device):
                        _other_draws(x.device)
                        compiled = graph(*inputs).detach()
            except RuntimeError as error:  # an operation the tracer cannot record
                self.refused = f"torch.jit.trace failed: {error}".splitlines()[0]
                return None
            finally:  # the trace left its input tensors in the scale messenger
                self.scale.data_scale, self.scale.kl_weight = float(data_scale), float(kl_weight)
            with forked(x.device), torch.no_grad(), self.context():
                _other_draws(x.device)
                eager = self.elbo.differentiable_loss(self.model, self.guide, x, y).detach()
        if not torch.isfinite(eager):
            return UNCHECKED
        if not torch.allclose(compiled, eager, rtol=CHECK_RTOL, atol=0.0):
            self.refused = (
                f"the compiled loss ({compiled.item():.6g}) differs from the eager one "
                f"({eager.item():.6g}) on the same draws"
            )
            return None
        self.refused = None
        return graph


def trace(function: Callable, inputs: tuple) -> torch.ScriptFunction:
    """``function`` traced on ``inputs`` as a TorchScript function of its own, which holds the
    only reference to its compilation unit: dropping the function frees its graph and its
    executor's plans.

    ``torch.jit.trace`` registers every function it traces in TorchScript's one process-wide
    compilation unit, which never lets go of them: each fit kept its graphs until the process
    ended. This is the one place that uses the tracer's
    private entry point (``torch._C._create_graph_by_tracing``, as ``torch.jit.trace`` does,
    strict and without out-of-place rewriting); ``tests/zoo/test_compiled.py`` fails when it
    changes."""
    from torch.jit._trace import _create_interpreter_name_lookup_fn

    graph, _ = torch._C._create_graph_by_tracing(
        function, list(inputs), _create_interpreter_name_lookup_fn(0), True, False
    )
    unit = torch._C.CompilationUnit()
    return unit.create_function(getattr(function, "__name__", "traced"), graph)


def replanned(device: torch.device) -> bool:
    """Whether a graph on ``device`` runs re-planned (:data:`OPTIMISED_EXECUTION`)."""
    return OPTIMISED_EXECUTION.get(device.type, True)


class ExecutorSetting:
    """A traced graph called under ``torch.jit.optimized_execution(optimised)``: with
    ``optimised=False`` it replays its operations, random draws included, in the traced (eager)
    order. The executor's setting is the caller's again after each call."""

    def __init__(self, function, optimised: bool):
        self.function = function  # the traced ScriptFunction
        self.optimised = bool(optimised)

    @property
    def graph(self):
        """The TorchScript graph of the traced function."""
        return self.function.graph

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.jit.optimized_execution(self.optimised):
            return self.function(*inputs)


def _weak_method(method):
    """``method`` called through a weak reference to its object: the traced function keeps the
    Python function it traced, and through a bound method the graph would keep the
    ``TracedLoss`` that holds the graph, a reference cycle that only the cycle collector frees
    (a dropped fit then keeps its guide, its parameters and its optimiser state alive until it
    runs)."""
    ref, func = weakref.ref(method.__self__), method.__func__

    def call(*inputs):
        return func(ref(), *inputs)

    call.__name__ = func.__name__
    return call


def _other_draws(device: torch.device) -> None:
    """Move torch's generators on (inside :func:`zoo.runtime.rng.forked`), so that the check draws
    other values than the trace did: a value the trace froze then differs from the eager one."""
    torch.randn(1024)
    if device.type == "cuda":
        torch.randn(1024, device=device)
