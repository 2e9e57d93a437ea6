"""The compiled loss: Pyro's ELBO traced once by TorchScript's tracer and replayed every step.

A step of the eager loss runs Pyro's two traces, a distribution object and a log-density per
site, and the ELBO's bookkeeping in Python: for a small network that host work is most of the
step. :class:`CompiledLoss` records the tensor operations of one evaluation (guide draws, model,
log-densities, the sum) as a TorchScript graph and replays it: the same operations in the same
order, without the Python around them.

What is traced is the loss of :mod:`zoo.inference.surrogate` (Pyro's ``Trace_ELBO`` or
``TraceMeanField_ELBO``, reduced with one sum per scale): for a guide whose sites are all
reparameterised (every family in ``guides``) it is the ``-ELBO`` estimate and the surrogate whose
gradient Pyro's ``SVI`` follows at once, so the compiled loss equals the eager one in value and
gradient, for the same random draws (the graph's random operations draw from torch's generators
in the eager order). Inputs of the graph: every
optimised parameter (guide and model), the minibatch, and the two scales of
:mod:`zoo.inference.elbo` (``N / B`` and the KL weight), so a schedule of KL weights needs no new
graph; a new minibatch shape compiles one more, except the last, smaller batch of an epoch, which
:class:`zoo.Objective` evaluates eagerly (it comes once an epoch; its graph would cost more to
build than it saves).

A graph runs in one of two plans. In the traced order (``torch.jit.optimized_execution(False)``)
it replays the eager loss's operations, and their autograd backward, so its values and gradients
are the eager loss's to the bit. Re-planned (TorchScript's graph executor, after its first runs)
it is the same function, its backward differentiated symbolically, fused on CUDA: on the CPU
the re-planning costs about five times the rest of a graph's start-up and saves 2-13% of a step
(``benchmarks/startup.py --phases`` and ``benchmarks/executor_order.py``,
``benchmarks/README.md``). So a fit's first :data:`REPLAN_AFTER` steps on a device run the
traced order and the later ones the re-planned graph (where :data:`OPTIMISED_EXECUTION` allows
it): a short fit never pays the re-planning, a long one repays it (the re-planned graph runs
the function traced for the first steps, so the switch costs no second trace). The plan follows
the fit's global step, not its length, so a fit's first ``k`` steps are those of any longer fit
and a resumed fit computes what the uninterrupted one did. The re-planned order of independent
random operations can differ from the traced one (the block-diagonal guide's noise draw moved
ahead of the weights'; MC dropout's masks and pre-activation noise under ``estimator="local"``
swapped between layers), and the graph then evaluates the loss on other draws than the eager
loss (1e-5 to 1e-2 relative). Such a graph fails the check below and the traced order runs in
its place.

When a graph is built, its value is checked once against the eager loss (the same ELBO's
``differentiable_loss``), both on the same draws (other than the ones the trace saw), after
``CHECK_RUNS`` runs of the graph: TorchScript's executor optimises a graph after its first
run, and an optimised plan can draw its random numbers in another order than the traced one
(``tests/zoo/test_compiled.py`` has a case). A guide with a site that is not reparameterised
(its surrogate is not the loss) or a program whose Python reads tensor values that the graph
would freeze shows there, and is evaluated eagerly instead.
:func:`compile_refusal` lists what is never compiled.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch

from zoo.inference.elbo import ElboScale
from zoo.runtime import threads
from zoo.runtime.rng import forked

#: Relative difference between the compiled and the eager loss above which a graph is refused.
CHECK_RTOL = 1e-4
#: Runs of a new re-planned graph before its value is checked: TorchScript's executor profiles a
#: graph on its first run and optimises it for the runs after, so the check sees the plan every
#: step runs (a graph in the traced order is checked on its first run).
CHECK_RUNS = 3
#: Per device type, whether graphs may run with TorchScript's executor optimisation (its
#: re-planned order of random operations can differ from the traced one; module docstring).
OPTIMISED_EXECUTION = {"cpu": True, "cuda": True}
#: Per device type, the steps of a fit (its global step) that run a graph in the traced order
#: before a re-planned graph is built (module docstring). On CUDA the CUDA-graph step captures
#: the re-planned graph from the start.
REPLAN_AFTER = {"cpu": 1000, "cuda": 0}
#: What ``CompiledLoss._compile`` returns when the eager loss is not finite (nothing to compare).
UNCHECKED = object()


def compile_refusal(model, guide, num_particles: int) -> str | None:
    """Why ``model`` and ``guide`` are evaluated eagerly under ``jit="auto"`` (``None``: they
    are compiled): only ``zoo`` models with a ``guides`` family and one particle per step (the
    vectorised particles run through ``torch.func.vmap``, which ``torch.jit.trace`` cannot
    record)."""
    from guides.base import PerSiteGuide
    from zoo.models.base import BayesianModel

    if not isinstance(model, BayesianModel):
        return "the model is not a zoo.models.BayesianModel"
    if not isinstance(guide, PerSiteGuide):
        return "the guide is not a guides family (PerSiteGuide)"
    if num_particles != 1:
        return "num_particles > 1 (vectorised particles use torch.func.vmap)"
    return None


class CompiledLoss:
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

    def __init__(self, elbo, model, guide, params, scale: ElboScale, context: Callable):
        self.elbo, self.model, self.guide = elbo, model, guide
        self.params, self.scale, self.context = list(params), scale, context
        self.graphs: dict[tuple, torch.jit.ScriptFunction | None] = {}
        #: Why the last refused graph was refused (``None`` while none was).
        self.refused: str | None = None

    def surrogate(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The surrogate loss of ``(x, y, data_scale, kl_weight)`` (the last four inputs;
        the parameters before them are read from the modules, by identity)."""
        x, y, data_scale, kl_weight = inputs[-4:]
        self.scale.data_scale, self.scale.kl_weight = data_scale, kl_weight
        with self.context():
            return self.elbo.differentiable_loss(self.model, self.guide, x, y)

    def graph_for(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        data_scale: float,
        kl_weight: float,
        step: int | None = None,
    ):
        """The checked graph for minibatches shaped like ``(x, y)`` at the fit's global
        ``step`` (compiled on first use; ``None``: the plan of a long fit's later steps), called
        as ``graph(*params, x, y, data_scale, kl_weight)`` with the scales as 0-d tensors of the
        parameters' dtype; ``None`` when it was refused, or could not be checked yet because the
        loss is not finite."""
        optimised = replanned(x.device, step)
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, x.device, optimised)
        if key not in self.graphs:
            # The re-planned graph runs the traced-order graph's function: once TorchScript has
            # an optimised plan for a function it runs that plan whatever the setting, so the
            # traced-order entry goes (a refused re-plan traces the traced order afresh).
            traced = self.graphs.pop((*key[:-1], False), None) if optimised else None
            graph = self._compile(x, y, data_scale, kl_weight, optimised, traced)
            if graph is UNCHECKED:
                return None  # no verdict on a non-finite loss: eager now, compile again later
            self.graphs[key] = graph
        return self.graphs[key]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the scales a graph takes (the parameters')."""
        return self.params[0].dtype if self.params else torch.get_default_dtype()

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        data_scale: float,
        kl_weight: float,
        step: int | None = None,
    ):
        """The loss of this minibatch at the fit's global ``step`` through its graph (compiled
        on first use), or ``None`` when its graph was refused, or could not be checked yet
        because the loss is not finite: the caller evaluates it eagerly then."""
        graph = self.graph_for(x, y, data_scale, kl_weight, step)
        if graph is None:
            return None
        try:
            return graph(*self.params, x, y, *self._scales(x, data_scale, kl_weight))
        except RuntimeError as err:  # Ctrl-C inside the TorchScript interpreter
            if "KeyboardInterrupt" in str(err):
                raise KeyboardInterrupt from err
            raise

    def _scales(self, x: torch.Tensor, data_scale: float, kl_weight: float):
        return torch.tensor([data_scale, kl_weight], dtype=self.dtype, device=x.device).unbind()

    def _compile(self, x, y, data_scale: float, kl_weight: float, optimised: bool, traced=None):
        """A checked graph for ``(x, y)``: re-planned if ``optimised`` and its value is right,
        else in the traced order; ``None`` (with ``self.refused``) when neither matches the
        eager loss, ``UNCHECKED`` when the eager loss is not finite. ``traced``: this shape's
        graph in the traced order, whose function the re-planned graph runs (no second trace)."""
        if optimised:
            graph = self._checked(x, y, data_scale, kl_weight, True, traced)
            if graph is not None or self.refused.startswith("torch.jit.trace failed"):
                return graph
        return self._checked(x, y, data_scale, kl_weight, False)  # the re-planned draws differ

    def _checked(self, x, y, data_scale: float, kl_weight: float, optimised: bool, traced=None):
        inputs = (*self.params, x, y, *self._scales(x, data_scale, kl_weight))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values
            try:
                if traced is None:
                    with forked(x.device), torch.jit.optimized_execution(optimised):
                        function = trace(_weak_method(self.surrogate), inputs)
                else:
                    function = traced.function
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
    compilation unit, which never lets go of them: each fit kept its graphs (about 2 MiB for a
    small network) until the process ended. This is the one place that uses the tracer's
    private entry point (``torch._C._create_graph_by_tracing``, as ``torch.jit.trace`` does,
    strict and without out-of-place rewriting); ``tests/zoo/test_compiled.py`` fails when it
    changes."""
    from torch.jit._trace import _create_interpreter_name_lookup_fn

    graph, _ = torch._C._create_graph_by_tracing(
        function, list(inputs), _create_interpreter_name_lookup_fn(0), True, False
    )
    unit = torch._C.CompilationUnit()
    return unit.create_function(getattr(function, "__name__", "traced"), graph)


def replanned(device: torch.device, step: int | None) -> bool:
    """Whether a graph at a fit's global ``step`` on ``device`` runs re-planned
    (:data:`OPTIMISED_EXECUTION`, :data:`REPLAN_AFTER`; ``step=None``: a long fit's later
    steps)."""
    if not OPTIMISED_EXECUTION.get(device.type, True):
        return False
    return step is None or step >= REPLAN_AFTER.get(device.type, 0)


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
    ``CompiledLoss`` that holds the graph, a reference cycle that only the cycle collector frees
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


def jit_size_refusal(device: torch.device, flops: Callable[[], int]) -> str | None:
    """Why ``jit="auto"`` leaves a step eager for its size (``None``: compile it). On the CPU a
    large step is arithmetic that the graph does not make faster (and for the structured
    families on the 784-400-400-10 MLP, slower: ``benchmarks/README.md``); on CUDA the host
    work that the graph removes is most of the step whatever the size."""
    if device.type != "cpu":
        return None
    count = flops()
    if count < threads.SMALL_STEP_FLOPS:
        return None
    return (
        f"a large step on the CPU: its forward pass is {count / 1e6:.3g} MFLOP, at least "
        f"SMALL_STEP_FLOPS = {threads.SMALL_STEP_FLOPS / 1e6:g} M"
    )
