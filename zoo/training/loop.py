"""The loop of a fit (:class:`Trainer`): epochs, checkpoints, callbacks, progress, Ctrl-C and
the convergence rule, around a :class:`zoo.training.step.Stepper` that takes the steps.
:func:`zoo.fit` builds one and runs it."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

from tqdm import tqdm

from zoo.data.batches import Batches
from zoo.priors import Prior
from zoo.results.variational import FitResult
from zoo.runtime.distributed import Ranks
from zoo.runtime.serial import user_code
from zoo.storage import files
from zoo.training.checkpoint import write_checkpoint
from zoo.training.convergence import Convergence, ConvergenceTracker
from zoo.training.divergence import FitDivergedError, warn_blow_up, warn_skipped
from zoo.training.optim import apply_factor
from zoo.training.step import Stepper

#: Steps between the progress bar's updates of the loss it shows (at the host's reads).
POSTFIX_EVERY = 10


@dataclass
class CallbackView:
    """What a callback sees after every step. Return ``True`` from the callback to stop."""

    step: int
    epoch: int
    loss: float
    epoch_end: bool
    result: FitResult


class CheckpointError(OSError):
    """A checkpoint could not be written (a full disk, a folder gone): the fit stops there and
    ``err.result`` holds it as it was (every step taken), to save elsewhere or use."""

    def __init__(self, path: str | os.PathLike, step: int, cause: OSError, result: FitResult):
        message = (
            f"could not write the checkpoint {str(path)!r} at step {step} "
            f"({cause.strerror or cause}); the fit stopped there: the error's .result holds "
            "the fit so far (result.save(...) to another place keeps it)"
        )
        super().__init__(*((cause.errno, message) if cause.errno else (message,)))
        self.result = result


class DataLengthError(ValueError):
    """The data gave fewer minibatches in an epoch than their length said: the fit stops there
    and ``err.result`` holds it as it was."""

    def __init__(self, message: str, result: FitResult):
        super().__init__(message)
        self.result = result


class Trainer:
    """Runs a fit's steps on its :class:`~zoo.training.step.Stepper`: every epoch's minibatches
    in order (a resumed fit replays its epoch's shuffle and skips the steps done), the host's
    reads when the stepper or the loop needs them (a full group, an epoch's end, a checkpoint,
    the last step, callbacks, a convergence window), checkpoints, callbacks, a progress bar and
    Ctrl-C. Built by :func:`zoo.fit`."""

    def __init__(
        self,
        *,
        stepper: Stepper,
        batches: Batches,
        generator,
        result: FitResult,
        checkpoint,
        checkpoint_every: int | None,
        identity: dict | None = None,
        ranks: Ranks | None = None,
        convergence: ConvergenceTracker | None = None,
    ):
        self.stepper, self.state, self.batches = stepper, stepper.state, batches
        self.generator, self.result = generator, result
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every
        self.identity = identity
        self.ranks = ranks if ranks is not None else Ranks()
        self.convergence = convergence
        self.steps_per_epoch = stepper.plan.steps_per_epoch(batches.steps_per_epoch)
        # The result shows the state's history as it grows.
        state = self.state
        result.losses, result.epoch_losses = state.losses, state.epoch_losses
        result.skipped_steps = state.skipped_steps
        self._start = time.perf_counter()
        self._elapsed = state.wall_time
        self.reason: str | None = None  # "callback" or "converged" when one stops the fit

    def run(self, total: int, callbacks: list, progress: bool) -> None:
        """Steps until ``total`` steps are taken, a callback returns ``True``, the convergence
        rule stops or Ctrl-C (:meth:`outcome` says which)."""
        try:
            self._run(total, callbacks, progress)
        except FitDivergedError as err:
            err.result = self.result
            raise

    def _run(self, total: int, callbacks: list, progress: bool) -> None:
        state, stepper = self.state, self.stepper
        show = progress and self.ranks.is_global_zero
        bar = tqdm(
            total=total, initial=state.step, disable=not show, unit="step", dynamic_ncols=True
        )
        self._start = time.perf_counter()
        stepper.begin()
        stop, shown = False, state.step
        if state.step > 0 and self._converged(resumed=True):
            stop, self.reason = True, "converged"
        try:
            while state.step < total and not stop:
                self.generator.set_state(state.epoch_start_state)
                steps = stepper.steps(self.batches.epoch(state.epoch))
                before, seen = state.step, 0
                for index, inputs in enumerate(steps):
                    seen = index + 1
                    if index < state.done_in_epoch:
                        continue
                    stepper.step(inputs)
                    state.done_in_epoch = index + 1
                    bar.update(1)
                    if not self._read_due(total, callbacks):
                        continue
                    value = stepper.settle()
                    if state.step >= shown + POSTFIX_EVERY or state.step >= total:
                        bar.set_postfix(epoch=state.epoch, loss=f"{value:.4g}", refresh=False)
                        shown = state.step
                    stop = self._after_step(value, total, callbacks)
                    if stop:
                        self.reason = "callback"
                    elif self._converged():
                        stop, self.reason = True, "converged"
                    if stop or state.step >= total:
                        break
                if state.step == before and not stop:
                    self._no_progress(seen)
        except KeyboardInterrupt:
            self.result.interrupted = True
            stepper.settle()
            self.save_checkpoint(gather=False)  # other ranks may not be here to gather
        finally:
            bar.close()
            self.result.wall_time = self._wall_time()
        if stepper.last_inputs is not None and not self.result.interrupted:
            self.final_check()
        if not self.result.interrupted:
            self.save_checkpoint()
        if self.ranks.is_global_zero:
            warn_skipped(state.skipped_steps, state.step)
            warn_blow_up(state.losses)
            self.warn_prior()

    def _no_progress(self, seen: int) -> None:
        """A pass over an epoch took no step: the data gave fewer minibatches than the fit has
        taken of this epoch (an ``IterableDataset`` shorter than its ``__len__``, a loader that
        changed). Going round again would spin for ever."""
        state = self.state
        raise DataLengthError(
            f"epoch {state.epoch} of the data gave {seen} minibatch(es), but the fit had taken "
            f"{state.done_in_epoch} of this epoch and expected {self.steps_per_epoch} "
            "(len of the data's loader): the data give fewer batches than their length says, "
            "or changed since the fit began; make __len__ match what __iter__ yields",
            self.result,
        )

    def _converged(self, resumed: bool = False) -> bool:
        """The convergence rule's verdict at a window's end (``num_steps="auto"``), replayed
        from the losses; ``resumed``: at a resumed fit's start, wherever it is. A rate cut it
        finds applies from the next step, found now or before a resume (a resumed tracker
        starts with no cuts, so its earlier cuts are applied again)."""
        rule, scheduler = self.convergence, self.stepper.scheduler
        if rule is None or not (resumed or rule.due(self.state.step)):
            return False
        cuts = len(rule.cuts)
        converged = rule.update(self.state.losses)
        if len(rule.cuts) != cuts and scheduler is not None:
            apply_factor(scheduler)
        return converged and rule.due(self.state.step)

    def outcome(self) -> dict:
        """How the fit ended: ``stopped`` (why) and ``stopped_at`` (the step); ``lr_cuts``
        under a convergence rule, else ``plateau_at``, where ``num_steps="auto"`` would first
        have cut the rate (``None``: still improving)."""
        reason = self.reason
        if self.result.interrupted:
            reason = "interrupted"
        elif reason is None:
            reason = "cap" if self.convergence is not None else "num_steps"
        found = dict(stopped=reason, stopped_at=self.state.step)
        if self.convergence is not None:
            found["lr_cuts"] = self.convergence.cuts
        else:
            plateaus = Convergence().plateaus(self.state.losses, len(self.batches))
            found["plateau_at"] = plateaus[0] if plateaus else None
        return found

    def warn_prior(self) -> None:
        """The prior's own warnings about its fitted state (a collapsed learned scale)."""
        prior = getattr(self.stepper.objective.model, "prior", None)
        for message in prior.diagnose() if isinstance(prior, Prior) else []:
            warnings.warn(message, RuntimeWarning, stacklevel=5)

    def _read_due(self, total: int, callbacks: list) -> bool:
        """Whether the host reads the losses now: the stepper's group is full, an epoch's end,
        a checkpoint, the last step, a convergence window's end, or callbacks (which see every
        step's loss)."""
        state, every = self.state, self.checkpoint_every
        return (
            self.stepper.due
            or bool(callbacks)
            or state.step >= total
            or state.done_in_epoch == self.steps_per_epoch
            or (every is not None and state.step % every == 0)
            or (self.convergence is not None and self.convergence.due(state.step))
        )

    def _after_step(self, value: float, total: int, callbacks: list) -> bool:
        """Epoch bookkeeping, checkpoint and callbacks; ``True`` when a callback stops."""
        state = self.state
        epoch_end = state.done_in_epoch == self.steps_per_epoch
        fit_state = CallbackView(
            state.step, state.epoch, value, epoch_end or state.step == total, self.result
        )
        if epoch_end:
            state.end_epoch(self.generator)
        every = self.checkpoint_every
        if (every is not None and state.step % every == 0) or (every is None and epoch_end):
            self.save_checkpoint()
        if not callbacks:
            return False
        with user_code():  # the lock lent out: a call the callback starts elsewhere runs
            stop = any(cb(fit_state) for cb in callbacks)
        return self.ranks.any(stop, state.step)

    def final_check(self) -> None:
        """The last update is checked by no step: evaluate its loss, invisibly to the RNG."""
        if self.stepper.guard.good_step is None:
            return
        rng = files.rng_state(self.generator)
        final = self.stepper.final_loss()
        files.set_rng_state(rng, self.generator)
        self.stepper.guard.final_check(final, self.state.step - 1)

    def save_checkpoint(self, gather: bool = True) -> None:
        """Write the checkpoint, if the fit has one: rank 0 writes it, with every rank's
        generator state when the ranks can ``gather`` (all reach this call together)."""
        if self.checkpoint is None:
            return
        self.state.wall_time = self._wall_time()
        rank_rng = None
        if self.ranks.distributed and gather:
            rank_rng = self.ranks.gather(files.torch_rng_state(), self.state.step)
        if not self.ranks.is_global_zero:
            return
        stepper = self.stepper
        try:
            self._write(stepper, rank_rng)
        except OSError as err:
            raise CheckpointError(self.checkpoint, self.state.step, err, self.result) from err

    def _write(self, stepper, rank_rng) -> None:
        write_checkpoint(
            self.checkpoint,
            state=self.state,
            guide=stepper.objective.guide,
            model=stepper.objective.model,
            optimizer=stepper.optimizer,
            scheduler=stepper.scheduler,
            generator=self.generator,
            options=self.result.options,
            rank_rng=rank_rng,
            identity=self.identity,
        )

    def _wall_time(self) -> float:
        return self._elapsed + time.perf_counter() - self._start
