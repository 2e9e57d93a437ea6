"""The whole step as one CUDA graph (``zoo.fit(..., cuda_graph=True)``).

With the compiled loss (:mod:`zoo.compiled`) the Python of Pyro's traces is gone, but every
step still launches each of its kernels from the host: the forward pass, the backward pass, the
gradient norm, the fused optimiser. On a GPU these launches, not the arithmetic, bound the step
of a small network. :class:`GraphedStep` records them once with ``torch.cuda.graph`` and replays
the recording: one launch per step.

What the graph holds, and what stays outside:

- **Inputs** are static buffers: each minibatch is copied into the buffers the graph reads, and
  the two scales of :mod:`zoo.elbo` (``N / B`` and the KL weight) are 0-d tensors filled before
  each replay, so a KL schedule needs no new graph. The learning rates become 0-d tensors in the
  optimiser's groups, which the schedule fills in place (``LambdaLR`` does for tensor rates).
- **Random numbers**: the graph draws from torch's CUDA generator, whose offset advances with
  every replay (torch registers it with the graph), so every step draws afresh, as eagerly.
- **Divergence**: the loss and gradient norm are tested on the device and the fused optimiser
  skips a non-finite update (:class:`zoo.deferred.DeferredGuard`); the host reads the results
  every ``check_every`` steps.
- **Outside the graph**: minibatches of another shape (the last of an epoch when ``B`` does
  not divide ``N``) run the same step eagerly, as do the first step (Pyro's validation) and the
  ``WARMUP_STEPS`` steps before the capture, which run on a side stream as CUDA graphs require.
  Every call is one real optimiser step: capturing a step does not run it, so the capture is
  followed by its first replay.

It needs the compiled loss (``jit`` must compile: the eager loss reads values on the host, e.g.
Pyro's NaN warnings, which a capture cannot contain), a CUDA device, one process, and torch's
fused Adam, AdamW or SGD (``capturable`` is set on the groups).
"""

from __future__ import annotations

import torch

from zoo.deferred import DeferredGuard, resolve_check_every, validate_check_every
from zoo.divergence import DivergenceGuard
from zoo.objective import Objective
from zoo.optim import grad_norm

#: Eager steps on a side stream before the capture (the TorchScript executor profiles and
#: optimises a graph on its first runs, and the optimiser creates its state on the first).
WARMUP_STEPS = 3


def device_refusal(device: torch.device) -> str | None:
    """Why a fit on ``device`` cannot replay a CUDA graph (``None``: it can). A distributed fit
    is refused before it starts (:func:`check_step_options`)."""
    if device.type != "cuda":
        return f"cuda_graph=True needs a CUDA device; this fit runs on {device}"
    return None


def graph_refusal(objective: Objective, device: torch.device) -> str | None:
    """Why ``cuda_graph=True`` cannot be honoured (``None``: it can)."""
    reason = device_refusal(device)
    if reason is None and objective.compiled is None:
        reason = (
            "cuda_graph=True needs the compiled loss, and this one is eager: "
            f"{objective.jit_state} (pass jit=True to see why it cannot compile)"
        )
    return reason


class GraphedStep:
    """One optimiser step of a fit replayed from a CUDA graph (see the module's notes).

    Parameters
    ----------
    objective : Objective
        Set up, with its compiled loss.
    optimizer : torch.optim.Optimizer
        Fused Adam, AdamW or SGD over ``params``.
    params : list of Tensor
        Every optimised parameter, in the compiled graph's input order.
    guard : DeferredGuard
        Marks each step's skip flag on the device.
    num_data : int
        ``N``, for the data scale ``N / B``.
    clip_grad_norm : float or None
    per_example : bool
        Differentiate ``loss / N`` (the reported loss stays ``-ELBO``).
    capture : bool, optional
        Record and replay a CUDA graph (default: on a CUDA device). ``False`` runs the same
        step eagerly from the same static buffers (what the tests check on the CPU).
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        guard: DeferredGuard,
        num_data: int,
        clip_grad_norm: float | None = None,
        per_example: bool = False,
        capture: bool | None = None,
    ):
        self.objective, self.optimizer, self.guard = objective, optimizer, guard
        self.params = params
        self.num_data, self.clip, self.per_example = num_data, clip_grad_norm, per_example
        self.device = params[0].device
        self.capture = self.device.type == "cuda" if capture is None else capture
        dtype = objective.compiled.dtype
        self.data_scale = torch.zeros((), dtype=dtype, device=self.device)
        self.kl_weight = torch.zeros((), dtype=dtype, device=self.device)
        self.loss = torch.zeros((), dtype=dtype, device=self.device)
        self.norm = torch.zeros((), dtype=dtype, device=self.device)
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.fn = None
        self.graph = None
        self.calls = 0
        for group in optimizer.param_groups:  # rates the schedule fills in place
            lr = group["lr"]
            lr = lr.detach() if torch.is_tensor(lr) else torch.tensor(float(lr))
            group["lr"] = lr.to(device=self.device, dtype=torch.float32)
            if self.capture:
                group["capturable"] = True

    def accepts(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether a minibatch fits the static buffers (the first one seen sets their shape),
        and the compiled loss has a graph for it; otherwise the caller steps eagerly."""
        if self.x is None:
            fn = self.objective.compiled.graph_for(x, y, self.num_data / len(x), 1.0)
            if fn is None:
                return False
            self.fn, self.x, self.y = fn, torch.empty_like(x), torch.empty_like(y)
        return (x.shape, x.dtype, y.shape, y.dtype) == (
            self.x.shape,
            self.x.dtype,
            self.y.shape,
            self.y.dtype,
        )

    def step(self, x: torch.Tensor, y: torch.Tensor, kl_weight: float):
        """One real optimiser step on ``(x, y)``: eagerly during the warm-up, then the capture
        followed by its first replay, then replays. Returns the static ``(loss, grad_norm)``
        tensors (overwritten by the next step: copy what you keep)."""
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.data_scale.fill_(self.num_data / len(x))
        self.kl_weight.fill_(kl_weight)
        if not self.capture:
            self.optimizer.zero_grad(set_to_none=True)
            self._body()
        elif self.graph is not None:
            self.graph.replay()
        elif self.calls < WARMUP_STEPS:
            self._warm_up()
        else:
            self._record()
            self.graph.replay()
        self.calls += 1
        return self.loss, self.norm

    def _body(self) -> None:
        """Loss, gradients, norm (clipped), the device-side skip flag and the update."""
        loss = self.fn(*self.params, self.x, self.y, self.data_scale, self.kl_weight)
        (loss / self.num_data if self.per_example else loss).backward()
        norm = grad_norm(self.params, self.clip)
        self.guard.mark(loss, norm)
        self.optimizer.step()
        self.loss.copy_(loss.detach())
        self.norm.copy_(norm)

    def _warm_up(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.optimizer.zero_grad(set_to_none=True)
            self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _record(self) -> None:
        """Capture the step (this does not run it). The gradients are allocated inside the
        capture, so every replay writes them at the same addresses."""
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph

    def eager_zero_grad(self) -> None:
        """Before an eager step between replays: zero the gradients where they are (the graph
        writes and reads them at their captured addresses)."""
        self.optimizer.zero_grad(set_to_none=self.graph is None)


def check_step_options(check_every, cuda_graph, distributed: bool) -> None:
    """``zoo.fit``'s checks of ``check_every`` and ``cuda_graph`` that need no device or model,
    run before any process is started (``distributed``: the fit will start several)."""
    validate_check_every(check_every)
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph must be True or False, got {cuda_graph!r}")
    if distributed and cuda_graph:
        raise ValueError("cuda_graph=True applies to fits in one process")
    if distributed and check_every not in ("auto", 1):
        raise ValueError("check_every > 1 applies to fits in one process (ranks meet every step)")


def step_parts(
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    result,
    *,
    on_divergence: str,
    check_every: int | str,
    cuda_graph: bool,
    distributed: bool,
    num_data: int,
    clip_grad_norm: float | None,
    per_example: bool,
) -> tuple[GraphedStep | None, DivergenceGuard]:
    """``zoo.fit``'s step machinery: the CUDA-graph step (or ``None``) and the divergence
    guard, per-step or deferred (:func:`zoo.deferred.resolve_check_every`); records
    ``check_every`` and ``cuda_graph`` in ``result.options``. Raises ``ValueError`` before
    training when ``cuda_graph`` or ``check_every`` cannot be honoured."""
    device = params[0].device
    reason = graph_refusal(objective, device) if cuda_graph else None
    if reason is not None:
        raise ValueError(reason)
    every = resolve_check_every(check_every, device, optimizer, distributed, cuda_graph)
    guide = objective.guide
    if every > 1 or cuda_graph:  # the guard refuses an optimiser that cannot skip on the device
        guard = DeferredGuard(params, guide, on_divergence, result, optimizer, every)
    else:
        guard = DivergenceGuard(params, guide, on_divergence, result)
    graphed = None
    if cuda_graph:
        graphed = GraphedStep(
            objective,
            optimizer,
            objective.compiled.params,
            guard,
            num_data,
            clip_grad_norm,
            per_example,
        )
    result.options.update(check_every=every, cuda_graph=cuda_graph)
    return graphed, guard
