"""The stepper: one optimiser step of a fit, written once.

:class:`Stepper` takes a step's minibatches and runs the one body every step shares
(:meth:`Stepper.body`): the loss of each minibatch with its gradients, the ranks' average,
the gradient norm (clipped), the divergence test and the optimiser's update. What varies is
chosen once, by :func:`zoo.training.rules.plan`, never by a branch of the training loop:

- **where the divergence test runs**: on the host, which reads every step and updates only when
  the loss and gradient norm are finite; or on the device (``check_every > 1`` or a CUDA graph),
  where the fused optimiser skips a non-finite update on a flag the body sets, and the host reads
  the steps in groups (:attr:`Stepper.due`, :meth:`Stepper.settle`). The settlement is
  :class:`zoo.training.divergence.DivergenceGuard`'s, the same for both;
- **how the body runs**: eagerly, with the compiled loss, or replayed from a CUDA graph
  (:class:`zoo.training.cuda_graph.GraphedStep` records this same body);
- **how many processes share it**: the ranks' gradients are averaged between the backward pass
  and the norm (:meth:`zoo.runtime.distributed.Ranks.average_step`; one process passes through);
- **how many minibatches make a step** (``accumulate``): the step's loss is the mean of its
  minibatches' full-data estimates weighted by their sizes (see :mod:`zoo.inference.elbo`).

A hand-written loop gets the same step without ``zoo.fit``::

    objective = zoo.Objective(model, guide)
    objective.setup(x[:2], y[:2])
    params = [p for p in guide.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    engine = zoo.Stepper.build(objective, opt, num_data=len(x), check_every=10)
    for epoch in range(10):
        for xb, yb in loader:
            engine.step([(xb, yb)])
            if engine.due:
                print(engine.settle())   # -ELBO of the last step; raises FitDivergedError
    engine.settle()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from zoo.inference.elbo import differentiated
from zoo.inference.objective import Objective
from zoo.models.statistics import frozen_statistics, statistics_of
from zoo.runtime.distributed import Ranks
from zoo.training import rules as step_rules
from zoo.training.checkpoint import LoopState
from zoo.training.cuda_graph import GraphedStep
from zoo.training.divergence import DivergenceGuard
from zoo.training.optim import grad_norm
from zoo.training.options import Engine
from zoo.training.rules import StepPlan

Batch = tuple[torch.Tensor, torch.Tensor]


class Stepper:
    """Optimiser steps on minibatches, their divergence test and its settlement.

    Parameters
    ----------
    objective : Objective
        Set up on an example batch.
    optimizer : torch.optim.Optimizer
        Over ``params``; fused Adam, AdamW or SGD when ``plan.device_skip``.
    params : list of Tensor
        Every optimised parameter.
    guard : DivergenceGuard
    plan : zoo.training.rules.StepPlan
        Where the test runs, the CUDA graph, the minibatches per step.
    state : LoopState
        The fit's position and history, which :meth:`step` advances.
    num_data : int
        ``N``: each minibatch of ``B`` is scaled by ``N / B``.
    scheduler : LambdaLR, optional
        Stepped after each update the host took (every update when the device decides).
    clip_grad_norm : float, optional
    per_example : bool
        Differentiate ``-ELBO / N`` (reported losses stay ``-ELBO``).
    ranks : zoo.runtime.distributed.Ranks, optional
        The processes that average their gradients every step.
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        guard: DivergenceGuard,
        plan: StepPlan,
        state: LoopState,
        *,
        num_data: int,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        clip_grad_norm: float | None = None,
        per_example: bool = False,
        ranks: Ranks | None = None,
    ):
        self.objective, self.optimizer, self.scheduler = objective, optimizer, scheduler
        self.params, self.guard, self.plan, self.state = params, guard, plan, state
        self.num_data, self.clip, self.per_example = num_data, clip_grad_norm, per_example
        self.ranks = ranks if ranks is not None else Ranks()
        self.statistics = statistics_of(objective.model)  # batch norm's running statistics
        self.found_inf: torch.Tensor | None = None
        if plan.device_skip:  # read by the fused kernels: 1.0 skips the update
            self.found_inf = torch.zeros((), dtype=torch.float32, device=params[0].device)
            setattr(optimizer, "found_inf", self.found_inf)  # noqa: B010 (not an Optimizer field)
        self.graph = None
        if plan.cuda_graph:
            self.graph = GraphedStep(objective, optimizer, num_data, accumulate=plan.accumulate)
        self.pending: list[tuple[int, int, torch.Tensor]] = []
        self.last_value = math.nan
        self.last_inputs: list[Batch] | None = None
        self._taken = True

    @classmethod
    def build(
        cls,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        *,
        num_data: int,
        check_every: int | str = 1,
        accumulate: int = 1,
        on_divergence: str = "raise",
        state: LoopState | None = None,
        plan: StepPlan | None = None,
        **options: Any,
    ) -> Stepper:
        """A stepper over every parameter of ``optimizer``: how ``zoo.fit`` builds its own and
        how a hand-written loop gets the same step. The host reads the losses every
        ``check_every`` steps (``"auto"``: :mod:`zoo.training.rules`' rule, whose table also
        refuses what cannot combine) and a step takes ``accumulate`` minibatches, unless a
        ``plan`` made by :func:`zoo.training.rules.plan` is given (``zoo.fit``'s, from its
        ``zoo.Engine``); a fresh :class:`~zoo.training.checkpoint.LoopState` (its ``losses``
        are the history) unless ``state`` is given. ``options``: ``scheduler``,
        ``clip_grad_norm``, ``per_example``, ``ranks`` (as the constructor's)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if plan is None:
            engine = Engine(check_every=check_every, threads=None, accumulate=accumulate)
            plan = step_rules.plan(engine, objective, optimizer, params[0].device, False)
        # A diverged fit goes back to a copy of the parameters and of the running statistics.
        kept = [*params, *statistics_of(objective.model)]
        guard = DivergenceGuard(kept, objective.guide, on_divergence, plan.copy_every)
        built = cls(
            objective,
            optimizer,
            params,
            guard,
            plan,
            state or LoopState(),
            num_data=num_data,
            **options,
        )
        built.begin()
        return built

    # ---- the loop's view ---------------------------------------------------------------------
    def steps(self, batches: Iterable[Batch]) -> Iterator[list[Batch]]:
        """An epoch's minibatches as steps: ``accumulate`` of them at a time (the last step of
        an epoch may have fewer)."""
        group: list[Batch] = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.plan.accumulate:
                yield group
                group = []
        if group:
            yield group

    def begin(self) -> None:
        """Before the first step of a run (or a resumed run): copy the parameters the guard
        may go back to."""
        self.guard.offer(self.state.step)

    @property
    def last_taken(self) -> bool:
        """Whether the last step's update was taken: its loss and gradient norm were finite
        when the host tests each step (always ``True`` when the device decides)."""
        return self._taken

    @property
    def due(self) -> bool:
        """Whether the host should read the steps now: a full group, or every step when the
        host tests each step (its loss is read already)."""
        return self.found_inf is None or len(self.pending) >= self.plan.check_every

    def step(self, inputs: list[Batch]) -> None:
        """One optimiser step on ``inputs`` (``accumulate`` minibatches ``(x, y)``)."""
        state, graph = self.state, self.graph
        self.last_inputs = inputs
        if graph is not None and state.step > 0 and graph.accepts(inputs):
            kl_weight = self.objective.kl_weight_at(state.step)
            loss, norm = graph.step(inputs, kl_weight, self.body)
        else:
            if graph is not None:
                graph.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=True)
            loss, norm = self.body(inputs, self._objective_loss)
        if self.found_inf is not None:
            pair = torch.stack([loss.detach(), norm.detach().to(loss.dtype)])
            self.pending.append((state.step, state.epoch, pair))
        if self._taken and self.scheduler is not None:
            self.scheduler.step()
        state.step += 1
        if self.found_inf is None:
            self.guard.offer(state.step)

    def settle(self) -> float:
        """Read the steps the device has queued (one host synchronisation) and settle them
        (:meth:`DivergenceGuard.settle`: may raise
        :class:`~zoo.training.divergence.FitDivergedError`). Returns the last step's loss (``nan``
        before any)."""
        if not self.pending:
            return self.last_value
        pending, self.pending = self.pending, []
        values = torch.stack([pair for *_, pair in pending]).tolist()
        read = [(s, e, v, n) for (s, e, _), (v, n) in zip(pending, values)]
        self.guard.settle(read, self.state)
        self.guard.offer(self.state.step)
        self.last_value = values[-1][0]
        return self.last_value

    # ---- the step ----------------------------------------------------------------------------
    def body(
        self, inputs: list[Batch], loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step, written once: the loss and gradients of ``inputs`` (``loss_of(x, y)`` is
        one minibatch's ``-ELBO`` estimate), averaged over the ranks, the gradient norm
        (clipped), the divergence test and, unless it fails on the host, the update. No host
        read when the test runs on the device, so a CUDA graph can record it."""
        loss = self._gradients(inputs, loss_of)
        norm = grad_norm(self.params, self.clip)
        if self._may_update(loss, norm):
            self.optimizer.step()
        return loss, norm

    def _objective_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        step = self.state.step
        return self.objective.loss(x, y, self.num_data, step=step, validate=step == 0)

    def _gradients(self, inputs: list[Batch], loss_of: Callable) -> torch.Tensor:
        """The step's loss with its gradients in ``.grad``, averaged over the ranks (an error
        in this rank's step reaches the others before it is raised here)."""
        try:
            loss, error = self._accumulate(inputs, loss_of), None
        except Exception as err:
            if not self.ranks.distributed:
                raise
            loss, error = None, err  # every rank must join the step's collective
        loss = self.ranks.average_step(loss, self.params, self.state.step, error)
        # each rank's running statistics moved with its own minibatch: the ranks' mean, so that
        # every rank holds the same model (and a checkpoint resumes exactly)
        self.ranks.average_(self.statistics, self.state.step)
        return loss

    def _accumulate(self, inputs: list[Batch], loss_of: Callable) -> torch.Tensor:
        """``sum_i (B_i / sum B) L_i`` over the step's minibatches, each ``L_i`` a full-data
        ``-ELBO`` estimate (likelihood scaled by ``N / B_i``): unbiased, and for ``k``
        minibatches the gradient of their union as one minibatch."""
        loss: torch.Tensor | None = None
        for (x, y), share in zip(inputs, shares(inputs)):
            part = loss_of(x, y)
            weighted = part if share == 1 else part * share
            differentiated(weighted, self.num_data, self.per_example).backward()
            loss = weighted.detach() if loss is None else loss + weighted.detach()
        assert loss is not None, "a step has at least one minibatch"
        return loss

    def _may_update(self, loss: torch.Tensor, norm: torch.Tensor) -> bool:
        """The divergence test: on the device, the fused optimiser's skip flag (the update is
        always called); on the host, this step read and settled now (the update is called only
        when it is finite)."""
        if self.found_inf is not None:
            finite = torch.isfinite(loss.detach()) & torch.isfinite(norm)
            self.found_inf.copy_(finite.logical_not())
            return True
        state = self.state
        value, norm_value = torch.stack([loss.detach(), norm]).tolist()
        self.last_value = value
        self._taken = self.guard.settle([(state.step, state.epoch, value, norm_value)], state)
        return self._taken

    @torch.no_grad()
    def final_loss(self) -> float:
        """The loss of the last step's minibatches at the parameters after its update (no step
        evaluates them), eager and without gradients; ``nan`` before any step."""
        if self.last_inputs is None:
            return math.nan
        step, inputs = self.state.step, self.last_inputs
        with frozen_statistics():  # a check, not a training step
            value = sum(
                share * float(self.objective.loss(x, y, self.num_data, step=step, eager=True))
                for (x, y), share in zip(inputs, shares(inputs))
            )
        return self.ranks.mean(value, step)


def shares(inputs: list[Batch]) -> list[float]:
    """Each minibatch's share of a step's examples, ``B_i / sum_j B_j`` (``[1.0]`` for one): the
    weight of its full-data ``-ELBO`` estimate in the step's (:mod:`zoo.inference.elbo`)."""
    sizes = [len(x) for x, _ in inputs]
    return [size / sum(sizes) for size in sizes]
