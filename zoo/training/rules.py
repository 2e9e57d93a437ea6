"""Which step options combine, and why: the one table of the stepper's rules.

A fit's step is chosen by :class:`zoo.training.options.Engine` (``jit``, ``threads``,
``check_every``, ``cuda_graph``, ``accumulate``) on a device, an optimiser and a number of
processes. Every ``"auto"`` rule and every refusal is here, each with its reason;
:mod:`zoo.training.step` runs what
:func:`plan` decides and decides nothing itself.

======================  ==========================================================================
option                  rule
======================  ==========================================================================
``jit="auto"``          compile a ``zoo`` model with a ``guides`` family and one particle
                        (:func:`zoo.inference.compiled.compile_refusal`) at any size: on the CPU
                        the traced loss replays the eager operations (the same numbers) without
                        Pyro's per-site Python, which every network measured gains from
                        (``benchmarks/any_network.py``)
``threads="auto"``      one intra-op thread on the CPU under
                        :data:`~zoo.runtime.threads.SMALL_STEP_FLOPS` (threads only add waiting
                        there); torch's setting otherwise and on CUDA
``check_every="auto"``  1 (the host reads every step's loss) on the CPU, across processes and with
                        an optimiser that cannot skip an update on the device; otherwise
                        :data:`CUDA_CHECK_EVERY`
``check_every > 1``     needs one process (ranks meet every step anyway) and an optimiser that
                        skips on the device (:data:`DEVICE_SKIP_OPTIMIZERS`, fused)
``cuda_graph="auto"``   the graph step whenever the fit allows it: a CUDA device, one process, the
                        compiled loss and an optimiser that skips on the device; off otherwise,
                        with the reason in ``result.options["cuda_graph"]`` (on CUDA)
``cuda_graph=True``     the same needs, refused before training when one is missing; reads every
                        :data:`CUDA_CHECK_EVERY` steps by default
``accumulate=k``        ``k`` minibatches per optimiser step: combines with every option above
======================  ==========================================================================

The one size rule, :data:`~zoo.runtime.threads.SMALL_STEP_FLOPS`, is the threads'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zoo.runtime.threads import threads_for

#: Steps between the host's reads of the losses on CUDA under ``check_every="auto"``.
CUDA_CHECK_EVERY = 20
#: The optimisers whose fused kernels skip an update on a device-side ``found_inf`` flag.
DEVICE_SKIP_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)

#: The refusals, each with its reason (formatted with the option's value).
NEEDS_ONE_PROCESS = {
    "cuda_graph": "cuda_graph=True applies to fits in one process",
    "check_every": "check_every > 1 applies to fits in one process (ranks meet every step)",
}
NEEDS_DEVICE_SKIP = (
    "check_every > 1 and cuda_graph=True need an optimiser that skips a non-finite update on "
    "the device: optimizer='adam', 'adamw' or 'sgd' (built fused, the default); got {name}"
)
NEEDS_CUDA = "cuda_graph=True needs a CUDA device; this fit runs on {device}"
NEEDS_COMPILED = (
    "cuda_graph=True needs the compiled loss, and this one is eager: {state} (pass jit=True to "
    "see why it cannot compile)"
)


@dataclass(frozen=True)
class StepPlan:
    """What :func:`plan` decided for one fit.

    Attributes
    ----------
    check_every : int
        Steps between the host's reads of the losses (1: every step, the skip decided on the
        host; more: the skip decided on the device by the fused optimiser).
    cuda_graph : bool
        Replay the step from a CUDA graph.
    graph_off : str or None
        Why ``cuda_graph="auto"`` left a fit on a CUDA device without the graph.
    accumulate : int
        Minibatches per optimiser step.
    threads : int or None
        Intra-op CPU threads during the fit (``None``: torch's setting).
    """

    check_every: int
    cuda_graph: bool
    accumulate: int
    threads: int | None
    graph_off: str | None = None

    @property
    def graph_record(self) -> bool | str:
        """What ``result.options["cuda_graph"]`` says before the fit: ``True``, ``False``, or
        ``"off (reason)"`` when ``"auto"`` left a CUDA fit without the graph."""
        if self.cuda_graph or self.graph_off is None:
            return self.cuda_graph
        return f"off ({self.graph_off})"

    @property
    def device_skip(self) -> bool:
        """Whether a non-finite update is skipped on the device (no host read per step)."""
        return self.check_every > 1 or self.cuda_graph

    @property
    def copy_every(self) -> int | None:
        """Steps between the divergence guard's copies: the host's read cadence when the device
        skips, else ``None`` (the guard's own default, read every step)."""
        return self.check_every if self.device_skip else None

    def steps_per_epoch(self, batches_per_epoch: int) -> int:
        """Optimiser steps in an epoch of ``batches_per_epoch`` minibatches (``accumulate``
        of them a step; the last step of an epoch may have fewer)."""
        return math.ceil(batches_per_epoch / self.accumulate)


def check_options(engine, distributed: bool) -> None:
    """The checks of the engine options alone, before any process is started or any data read
    (``distributed``: the fit will start several processes)."""
    if distributed and engine.cuda_graph is True:
        raise ValueError(NEEDS_ONE_PROCESS["cuda_graph"])
    if distributed and engine.check_every not in ("auto", 1):
        raise ValueError(NEEDS_ONE_PROCESS["check_every"])


def supports_device_skip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can skip an update on a flag held on the device: torch's own
    Adam, AdamW and SGD running fused (``zoo.fit`` builds them so by default)."""
    return type(optimizer) in DEVICE_SKIP_OPTIMIZERS and all(
        g.get("fused") for g in optimizer.param_groups
    )


def check_every_for(
    check_every: int | str,
    device: torch.device,
    optimizer: torch.optim.Optimizer,
    distributed: bool,
    graph: bool = False,
) -> int:
    """Steps between reads of the loss on the host: ``"auto"`` reads every step on the CPU
    (where a read costs nothing), across processes (whose ranks meet every step anyway) and
    with optimisers that cannot skip on the device; every :data:`CUDA_CHECK_EVERY` steps on
    CUDA (or with a CUDA graph, ``graph``) otherwise. An explicit count is returned as it is."""
    if check_every == "auto":
        on_device = graph or device.type != "cpu"
        skips = supports_device_skip(optimizer)
        return CUDA_CHECK_EVERY if on_device and skips and not distributed else 1
    return int(check_every)


def device_refusal(device: torch.device) -> str | None:
    """Why a fit on ``device`` cannot replay a CUDA graph (``None``: it can)."""
    return NEEDS_CUDA.format(device=device) if device.type != "cuda" else None


def graph_refusal(objective, device: torch.device) -> str | None:
    """Why ``cuda_graph=True`` cannot be honoured on ``device`` with ``objective`` (``None``:
    it can)."""
    reason = device_refusal(device)
    if reason is not None:
        return reason
    if objective.backend is None:
        return NEEDS_COMPILED.format(state=objective.jit_state)
    return None


def graph_decision(
    cuda_graph: bool | str, objective, optimizer, device: torch.device, distributed: bool
) -> tuple[bool, str | None]:
    """``(replay a CUDA graph, why not)``: ``True`` refuses (``ValueError``) what cannot be
    honoured, ``"auto"`` turns the graph off with the reason, ``False`` is off."""
    if cuda_graph is False:
        return False, None
    reason = graph_refusal(objective, device)
    if reason is None and distributed:
        reason = NEEDS_ONE_PROCESS["cuda_graph"]
    if reason is None and not supports_device_skip(optimizer):
        reason = NEEDS_DEVICE_SKIP.format(name=type(optimizer).__name__)
    if reason is not None and cuda_graph is True:
        raise ValueError(reason)
    return reason is None, reason


def plan(engine, objective, optimizer, device: torch.device, distributed: bool) -> StepPlan:
    """The step a fit runs: ``engine`` (:class:`zoo.training.options.Engine`) resolved for this
    ``objective`` (set up), ``optimizer``, ``device`` and process count. Raises ``ValueError``,
    before training, for a combination the table refuses."""
    check_options(engine, distributed)
    graph, off = graph_decision(engine.cuda_graph, objective, optimizer, device, distributed)
    every = check_every_for(engine.check_every, device, optimizer, distributed, graph)
    if every > 1 and not supports_device_skip(optimizer):
        raise ValueError(NEEDS_DEVICE_SKIP.format(name=type(optimizer).__name__))
    threads = threads_for(engine.threads, device, objective.forward_flops)
    return StepPlan(
        check_every=every,
        cuda_graph=graph,
        accumulate=engine.accumulate,
        threads=threads,
        graph_off=off if device.type == "cuda" else None,
    )
