"""The steps of a fit (:class:`Trainer`): minibatches, losses, guarded updates, checkpoints,
callbacks, progress and Ctrl-C. :func:`zoo.fit` builds one and runs it."""

from __future__ import annotations

import time
import warnings

import torch
from tqdm import tqdm

from zoo import persist
from zoo.batches import Batches
from zoo.convergence import Convergence, ConvergenceTracker
from zoo.deferred import DeferredGuard
from zoo.distributed import Ranks
from zoo.divergence import DivergenceGuard
from zoo.graphed import GraphedStep
from zoo.objective import Objective
from zoo.optim import apply_factor, grad_norm
from zoo.priors import Prior
from zoo.result import FitResult, FitState
from zoo.state import TrainingState, write_checkpoint


class Trainer:
    """Takes the steps of a fit: one minibatch, one loss, one guarded update per step, with
    checkpoints, callbacks, a progress bar and Ctrl-C. Built by :func:`fit`.

    With a :class:`~zoo.deferred.DeferredGuard` the host reads the losses in groups
    (:meth:`deferred_step`, settled at group ends, epoch ends, checkpoints, the last step and
    Ctrl-C; every step when there are callbacks), and with a :class:`~zoo.graphed.GraphedStep`
    the steps of its shape replay a CUDA graph."""

    def __init__(
        self,
        *,
        objective: Objective,
        optimizer,
        scheduler,
        params: list[torch.Tensor],
        guard: DivergenceGuard,
        batches: Batches,
        generator: torch.Generator,
        state: TrainingState,
        result: FitResult,
        clip_grad_norm: float | None,
        per_example: bool,
        checkpoint,
        checkpoint_every: int | None,
        ranks: Ranks | None = None,
        graphed: GraphedStep | None = None,
        convergence: ConvergenceTracker | None = None,
    ):
        self.objective, self.optimizer, self.scheduler = objective, optimizer, scheduler
        self.params, self.guard, self.batches = params, guard, batches
        self.generator, self.state, self.result = generator, state, result
        self.clip_grad_norm, self.per_example = clip_grad_norm, per_example
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every
        self.ranks = ranks if ranks is not None else Ranks()
        self.graphed = graphed
        self.convergence = convergence
        self.deferred = isinstance(guard, DeferredGuard)
        # The result shows the state's history as it grows.
        result.losses, result.epoch_losses = state.losses, state.epoch_losses
        result.skipped_steps = state.skipped_steps
        self._start = time.perf_counter()
        self._elapsed = state.wall_time
        self._last_batch = None

    def run(self, total: int, callbacks: list, progress: bool) -> None:
        """Steps until ``total`` steps are taken, a callback returns ``True`` or Ctrl-C."""
        state = self.state
        show = progress and self.ranks.is_global_zero
        bar = tqdm(
            total=total, initial=state.step, disable=not show, unit="step", dynamic_ncols=True
        )
        self._start = time.perf_counter()
        if self.deferred:
            self.guard.begin(state.step)
        stop, reason = False, None
        if state.step > 0 and self._converged(resumed=True):
            stop, reason = True, "converged"
        try:
            while state.step < total and not stop:
                # Resuming mid-epoch replays the epoch's shuffle and skips the batches done.
                self.generator.set_state(state.epoch_start_state)
                for index, (xb, yb) in enumerate(self.batches.epoch(state.epoch)):
                    if index < state.done_in_epoch:
                        continue
                    if self.deferred:
                        self.deferred_step(xb, yb)
                    else:
                        value = self.step(xb, yb)
                    state.done_in_epoch = index + 1
                    bar.update(1)
                    if self.deferred:
                        if not self._read_due(total, callbacks):
                            continue
                        value = self.guard.flush(state)
                    if self.deferred or state.step % 10 == 0 or state.step == total:
                        bar.set_postfix(epoch=state.epoch, loss=f"{value:.4g}", refresh=False)
                    stop = self._after_step(value, total, callbacks)
                    if stop:
                        reason = "callback"
                    elif self._converged():
                        stop, reason = True, "converged"
                    if stop or state.step >= total:
                        break
        except KeyboardInterrupt:
            self.result.interrupted = True
            if self.deferred:
                self.guard.flush(state)
            self.save_checkpoint(gather=False)  # other ranks may not be here to gather
        finally:
            bar.close()
            self.result.wall_time = self._wall_time()
            self._record_stop(reason, total)
        if self._last_batch is not None and not self.result.interrupted:
            self.final_check()
        if not self.result.interrupted:
            self.save_checkpoint()
        if self.ranks.is_global_zero:
            self.guard.warn_skipped(state.step)
            self.warn_prior()

    def _converged(self, resumed: bool = False) -> bool:
        """The convergence rule's verdict at a window's end (``num_steps="auto"``), replayed
        from the losses; ``resumed``: at a resumed fit's start, wherever it is. A rate cut it
        finds applies from the next step, found now or before a resume (a resumed tracker
        starts with no cuts, so its earlier cuts are applied again)."""
        rule = self.convergence
        if rule is None or not (resumed or rule.due(self.state.step)):
            return False
        cuts = len(rule.cuts)
        converged = rule.update(self.state.losses)
        if len(rule.cuts) != cuts and self.scheduler is not None:
            apply_factor(self.scheduler)
        return converged and rule.due(self.state.step)

    def _record_stop(self, reason: str | None, total: int) -> None:
        """``options["stopped"]`` and ``options["stopped_at"]``: why and when the fit ended;
        ``options["lr_cuts"]`` under a convergence rule, else ``options["plateau_at"]``."""
        if self.result.interrupted:
            reason = "interrupted"
        elif reason is None:
            reason = "cap" if self.convergence is not None else "num_steps"
        self.result.options.update(stopped=reason, stopped_at=self.state.step)
        if self.convergence is not None:
            self.result.options["lr_cuts"] = self.convergence.cuts
        else:  # where num_steps="auto" would first have cut the rate (None: still improving)
            found = Convergence().plateaus(self.state.losses, len(self.batches))
            self.result.options["plateau_at"] = found[0] if found else None

    def warn_prior(self) -> None:
        """The prior's own warnings about its fitted state (a collapsed learned scale)."""
        prior = getattr(self.objective.model, "prior", None)
        for message in prior.diagnose() if isinstance(prior, Prior) else []:
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> float:
        """One minibatch: loss, gradients, the divergence check and (if finite) the update."""
        state = self.state
        self._last_batch = (xb, yb)
        self.optimizer.zero_grad(set_to_none=True)
        if self.ranks.distributed:
            loss = self._averaged_loss(xb, yb)
        else:
            loss = self._loss(xb, yb)
        norm = grad_norm(self.params, self.clip_grad_norm)
        value, norm_value = torch.stack([loss.detach(), norm]).tolist()
        if self.guard.step_is_finite(state.step, state.epoch, value, norm_value):
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            state.losses.append(value)
            state.epoch_partial.append(value)
        state.step += 1
        return value

    def deferred_step(self, xb: torch.Tensor, yb: torch.Tensor) -> None:
        """One minibatch without a host read: the optimiser skips a non-finite update on the
        device's flag, and the loss waits in the guard until :meth:`DeferredGuard.flush`."""
        state = self.state
        self._last_batch = (xb, yb)
        graphed = self.graphed
        if graphed is not None and state.step > 0 and graphed.accepts(xb, yb):
            kl_weight = self.objective.kl_weight_at(state.step)
            loss, norm = graphed.step(xb, yb, kl_weight)
        else:
            if graphed is not None:
                graphed.eager_zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(xb, yb)
            norm = grad_norm(self.params, self.clip_grad_norm)
            self.guard.mark(loss, norm)
            self.optimizer.step()
        self.guard.remember(state.step, state.epoch, loss, norm)
        if self.scheduler is not None:
            self.scheduler.step()
        state.step += 1

    def _read_due(self, total: int, callbacks: list) -> bool:
        """Whether the deferred losses must be read now: a full group, an epoch's end, a
        checkpoint, the last step, or callbacks (which see every step's loss)."""
        state, every = self.state, self.checkpoint_every
        return (
            self.guard.due
            or bool(callbacks)
            or state.step >= total
            or state.done_in_epoch == self.batches.steps_per_epoch
            or (every is not None and state.step % every == 0)
            or (self.convergence is not None and self.convergence.due(state.step))
        )

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """This process's loss, its gradients in ``.grad``."""
        step, num_data = self.state.step, len(self.batches)
        loss = self.objective.loss(xb, yb, num_data, step=step, validate=step == 0)
        (loss / num_data if self.per_example else loss).backward()
        return loss

    def _averaged_loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """The ranks' mean loss and gradients (:meth:`zoo.distributed.Ranks.average_step`); an
        error in this rank's step reaches the others before it is raised here."""
        try:
            loss, error = self._loss(xb, yb), None
        except Exception as err:  # every rank must join the step's collective
            loss, error = None, err
        return self.ranks.average_step(loss, self.params, self.state.step, error)

    def _after_step(self, value: float, total: int, callbacks: list) -> bool:
        """Epoch bookkeeping, checkpoint and callbacks; ``True`` when a callback stops."""
        state = self.state
        epoch_end = state.done_in_epoch == self.batches.steps_per_epoch
        fit_state = FitState(
            state.step, state.epoch, value, epoch_end or state.step == total, self.result
        )
        if epoch_end:
            state.end_epoch(self.generator)
        every = self.checkpoint_every
        if (every is not None and state.step % every == 0) or (every is None and epoch_end):
            self.save_checkpoint()
        stop = any(cb(fit_state) for cb in callbacks)
        return self.ranks.any(stop, state.step) if callbacks else False

    def final_check(self) -> None:
        """The last update is checked by no step: evaluate its loss, invisibly to the RNG."""
        if self.guard.last_good.step is None:
            return
        rng = persist.rng_state(self.generator)
        with torch.no_grad():
            final = float(
                self.objective.loss(
                    *self._last_batch, len(self.batches), step=self.state.step, eager=True
                )
            )
        final = self.ranks.mean(final, self.state.step)
        persist.set_rng_state(rng, self.generator)
        self.guard.final_check(final, self.state.step - 1)

    def save_checkpoint(self, gather: bool = True) -> None:
        """Write the checkpoint, if the fit has one: rank 0 writes it, with every rank's
        generator state when the ranks can ``gather`` (all reach this call together)."""
        if self.checkpoint is None:
            return
        self.state.wall_time = self._wall_time()
        rank_rng = None
        if self.ranks.distributed and gather:
            rank_rng = self.ranks.gather(persist.torch_rng_state(), self.state.step)
        if not self.ranks.is_global_zero:
            return
        write_checkpoint(
            self.checkpoint,
            state=self.state,
            guide=self.objective.guide,
            model=self.objective.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
            options=self.result.options,
            rank_rng=rank_rng,
        )

    def _wall_time(self) -> float:
        return self._elapsed + time.perf_counter() - self._start
