"""The divergence guard of a fit: no NaN parameters are ever returned.

Every step's loss and gradient norm are tested. Where the test runs is the stepper's
business (:mod:`zoo.training.step`): on the host, which reads each step and takes the update only if
both are finite; or on the device, where the fused optimiser skips a non-finite update on a
flag and the host reads the steps in groups. Either way the guard settles the steps the host has
read, in order, here and only here (a per-step check is a group of one):

- finite losses join the history;
- the first non-finite step raises :class:`FitDivergedError` (``on_divergence="raise"``; the
  steps after it in its group, taken on the device, are discarded), or is recorded as skipped
  (``"skip"``; ``MAX_CONSECUTIVE_SKIPS`` in a row raise);
- the guide goes back to a copy of parameters whose loss and gradients were finite.

Copies are taken before a step's update, at most every ``copy_every`` steps (the host's read
cadence, or :data:`LAST_GOOD_EVERY` when it reads every step), and count as good once that
step is read finite; two are kept, the verified one and the candidate. With skips decided on
the device a learning-rate schedule advances on skipped steps too (the host does not know yet),
and the guide goes back only when a group ends on a non-finite step (earlier ones were followed
by finite steps from parameters the skip left unchanged). The last update, which no step
evaluates, is checked after the loop (:meth:`DivergenceGuard.final_check`).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch

from zoo.runtime.torch_private import copy_tensors

if TYPE_CHECKING:  # the result a diverged fit hands back
    from zoo.results.variational import FitResult

#: With ``on_divergence="skip"``, this many non-finite steps in a row stop the fit.
MAX_CONSECUTIVE_SKIPS = 100
#: Steps between the copies of the parameters that a diverged fit goes back to, when the host
#: reads every step (a copy costs a read and a write of every parameter).
LAST_GOOD_EVERY = 10
ON_DIVERGENCE = ("raise", "skip")


class FitDivergedError(FloatingPointError):
    """The loss or a gradient became NaN or infinite. ``result`` holds the fit up to the last
    finite step: its guide is back at parameters that gave a finite loss and gradients (the
    message says which step's)."""

    def __init__(self, message: str, result: FitResult | None = None):
        super().__init__(message)
        self.result = result


def check_on_divergence(on_divergence) -> None:
    """Refuse an ``on_divergence`` that is not one of :data:`ON_DIVERGENCE`."""
    if on_divergence not in ON_DIVERGENCE:
        raise ValueError(f"on_divergence must be 'raise' or 'skip', got {on_divergence!r}")


class DivergenceGuard:
    """Settles the steps the host has read, and keeps the copy a diverged fit goes back to.

    Parameters
    ----------
    params : list of Tensor
        Every optimised parameter (viewed: optimisers update in place).
    guide : module
        Named in messages (the sites whose gradients are not finite).
    on_divergence : {"raise", "skip"}
    copy_every : int, optional
        Steps between copies (default :data:`LAST_GOOD_EVERY`, read when the guard is built).
    """

    def __init__(self, params, guide, on_divergence: str, copy_every: int | None = None):
        check_on_divergence(on_divergence)
        self.params = [p.detach() for p in params]
        self.guide, self.on_divergence = guide, on_divergence
        self.copy_every = LAST_GOOD_EVERY if copy_every is None else int(copy_every)
        self.good = [torch.empty_like(p) for p in self.params]
        self.candidate = [torch.empty_like(p) for p in self.params]
        self.good_step: int | None = None
        self.candidate_step: int | None = None
        self.in_a_row = 0

    @torch.no_grad()
    def begin(self, step: int) -> None:
        """Copy the parameters as they are before step ``step``'s update: the candidate that
        step's finite loss will verify."""
        copy_tensors(self.candidate, self.params)
        self.candidate_step = step

    def offer(self, step: int) -> None:
        """Before step ``step``'s update, with the earlier steps settled: take a copy if none is
        pending and the last verified one is ``copy_every`` steps old."""
        good = self.good_step
        if self.candidate_step is None and (good is None or step - good >= self.copy_every):
            self.begin(step)

    @torch.no_grad()
    def restore(self) -> None:
        """Put the verified copy back (nothing happens before the first)."""
        if self.good_step is not None:
            copy_tensors(self.params, self.good)

    def settle(self, read: list[tuple[int, int, float, float]], state) -> bool:
        """Settle the steps ``(step, epoch, loss, grad_norm)`` read from the device, in order:
        finite losses join ``state``'s history, non-finite steps raise
        :class:`FitDivergedError` (the first, ``"raise"``) or join ``state.skipped_steps``.
        ``.grad`` holds the last step's gradients. Returns whether the last step was finite."""
        first_bad = None
        for step, epoch, value, norm in read:
            if math.isfinite(value) and math.isfinite(norm):
                if step == self.candidate_step:
                    self._verify()
                if first_bad is None or self.on_divergence == "skip":
                    self.in_a_row = 0
                    state.losses.append(value)
                    state.epoch_partial.append(value)
                continue
            if first_bad is None:
                first_bad = (step, epoch, value, step == read[-1][0])
            if self.on_divergence == "skip":
                self._skip(step, state)
        last_finite = math.isfinite(read[-1][2]) and math.isfinite(read[-1][3])
        self.candidate_step = None  # verified, or stale: its step was read
        if first_bad is None:
            return True
        step, epoch, value, last = first_bad
        if self.on_divergence == "raise":
            # The gradients in .grad are the bad step's only when it was the last read.
            guide = self.guide if last else None
            message = divergence_message(step, epoch, value, guide, self.good_step, self.copy_every)
            self.restore()
            state.step = step
            raise FitDivergedError(message)
        if not last_finite:
            self.restore()
        return last_finite

    def _skip(self, step: int, state) -> None:
        state.skipped_steps.append(step)
        self.in_a_row += 1
        if self.in_a_row >= MAX_CONSECUTIVE_SKIPS:
            self.restore()
            raise FitDivergedError(
                f"{self.in_a_row} steps in a row had a non-finite loss or gradient "
                f"(on_divergence='skip' gives up); the last at step {step}. "
                f"{restored_message(self.good_step, self.copy_every)}"
            )

    def _verify(self) -> None:
        """The candidate's parameters gave a finite loss: it becomes the copy to go back to."""
        self.good, self.candidate = self.candidate, self.good
        self.good_step, self.candidate_step = self.candidate_step, None

    def final_check(self, value: float, last_step: int) -> None:
        """The loss after the last update: restore, then raise or warn, if it is not finite."""
        if math.isfinite(value):
            return
        message = (
            f"the parameters after the last update (step {last_step}) give a non-finite "
            f"loss ({value}). {restored_message(self.good_step, self.copy_every)}"
        )
        self.restore()
        if self.on_divergence == "raise":
            raise FitDivergedError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def warn_skipped(skipped: list[int], steps: int) -> None:
    """One warning at the end of a fit that skipped steps."""
    if skipped:
        warnings.warn(
            f"{len(skipped)} of {steps} steps were skipped for a non-finite loss or gradient "
            f"(the first at step {skipped[0]}; all in result.skipped_steps). Consider a "
            "smaller lr or clip_grad_norm.",
            RuntimeWarning,
            stacklevel=3,
        )


#: A fit whose loss, over its last :data:`BLOW_UP_WINDOW` steps, sits more than this many times
#: the magnitude of its best window's above that window (and no lower since) warns at its end.
BLOW_UP_FACTOR = 100.0
BLOW_UP_WINDOW = 20


class LossBlewUpWarning(RuntimeWarning):
    """A fit's loss grew by orders of magnitude and stayed there: finite, but no longer a fit."""


def warn_blow_up(losses: list[float]) -> None:
    """Warn when the median loss of the last :data:`BLOW_UP_WINDOW` steps is higher than the
    lowest median of any earlier window by more than :data:`BLOW_UP_FACTOR` times that
    median's magnitude (at least 1): a step that threw the parameters far away (437 ->
    1.9e23) leaves every loss finite, so no divergence test sees it."""
    k = BLOW_UP_WINDOW
    finite = [v for v in losses if math.isfinite(v)]
    if len(finite) < 2 * k:
        return
    t = torch.tensor(finite, dtype=torch.float64)
    medians = t.unfold(0, k, 1).median(-1).values
    best_at = int(medians[:-k].argmin())
    best, last = float(medians[best_at]), float(medians[-1])
    if last - best <= BLOW_UP_FACTOR * max(abs(best), 1.0):
        return
    jump = int((t[best_at:] > best + BLOW_UP_FACTOR * max(abs(best), 1.0)).nonzero()[0]) + best_at
    warnings.warn(
        f"the loss grew from about {best:.4g} to {last:.4g} and stayed there (it first jumped "
        f"at step {jump + 1}): the fit blew up without a non-finite value, and its parameters "
        "are far from any fit. Use a smaller lr, clip_grad_norm, or resume from a checkpoint "
        "written before that step",
        LossBlewUpWarning,
        stacklevel=3,
    )


def divergence_message(
    step: int, epoch: int, value: float, guide, good: int | None, every: int | None = None
) -> str:
    """What diverged where (the sites whose gradients in ``.grad`` are not finite, unless
    ``guide`` is ``None``), and where the guide is now."""
    bad = sorted(
        {
            name.rsplit(".", 1)[0].removeprefix("sites.")
            for name, p in (guide.named_parameters() if guide is not None else ())
            if p.grad is not None and not torch.isfinite(p.grad).all()
        }
    )
    where = f"; non-finite gradients at sites {bad}" if bad else ""
    return (
        f"the fit diverged at step {step} (epoch {epoch}): loss = {value}{where}. "
        f"{restored_message(good, every)}"
    )


def restored_message(good: int | None, every: int | None = None) -> str:
    """Where a diverged fit leaves the guide (copies taken every ``every`` steps, by default
    ``LAST_GOOD_EVERY``), and what to try."""
    if good is None:
        return (
            "The parameters the fit started from already give it (no finite step yet); check "
            "the data, the priors and init_scale."
        )
    return (
        f"The guide is back at the parameters of step {good}, which gave a finite loss and "
        f"gradients (a copy is kept every {every or LAST_GOOD_EVERY} steps). Try a smaller lr, "
        "clip_grad_norm, a smaller init_scale, or on_divergence='skip'."
    )
