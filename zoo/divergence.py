"""The divergence guard of a fit: no NaN parameters are ever returned.

After every step the loss and the gradient norm are checked. A non-finite one sends the guide
back to an in-memory copy of parameters that gave a finite loss and gradients (taken every
``LAST_GOOD_EVERY`` finite steps), then either raises :class:`FitDivergedError` or skips the step
(``on_divergence="skip"``, at most ``MAX_CONSECUTIVE_SKIPS`` in a row). The last update, which
no step evaluates, is checked once more after the loop (:meth:`DivergenceGuard.final_check`).
"""

from __future__ import annotations

import math
import warnings

import torch

#: With ``on_divergence="skip"``, this many non-finite steps in a row stop the fit.
MAX_CONSECUTIVE_SKIPS = 100
#: Steps between the in-memory copies of the parameters that a diverged fit goes back to.
LAST_GOOD_EVERY = 10
ON_DIVERGENCE = ("raise", "skip")


class FitDivergedError(FloatingPointError):
    """The loss or a gradient became NaN or infinite. ``result`` holds the fit up to the last
    finite step: its guide is back at the parameters that gave the last finite loss and
    gradients at one of the last ``LAST_GOOD_EVERY`` finite steps (the message says which)."""

    def __init__(self, message: str, result):
        super().__init__(message)
        self.result = result


class LastGood:
    """A copy of the parameters whose loss and gradients were finite, taken before the update
    of every ``every``-th finite step and restored when a step is not finite, so that a diverged
    fit never leaves the guide at parameters that give a non-finite loss (an update can leave
    finite parameters whose next loss is NaN). Copying every step would cost a read and a write
    of all parameters per step; every tenth costs a tenth of that."""

    def __init__(self, params: list[torch.Tensor], every: int | None = None):
        self.params = [p.detach() for p in params]  # views: optimisers update in place
        self.every = LAST_GOOD_EVERY if every is None else every
        self.copies = [torch.empty_like(p) for p in params]
        self.step: int | None = None
        self.offers = 0

    @torch.no_grad()
    def offer(self, step: int) -> None:
        """Called with the parameters of a finite step, before its update."""
        if self.offers % self.every == 0:
            torch._foreach_copy_(self.copies, self.params)
            self.step = step
        self.offers += 1

    @torch.no_grad()
    def restore(self) -> None:
        """Put the copied values back (nothing happens before the first copy)."""
        if self.step is not None:
            torch._foreach_copy_(self.params, self.copies)


class DivergenceGuard:
    """Decides, step by step, whether an update may be taken, and where a diverged fit ends.

    Parameters
    ----------
    params : list of Tensor
        Every optimised parameter.
    guide : module
        Named in messages (the sites whose gradients are not finite).
    on_divergence : {"raise", "skip"}
    result : FitResult
        Attached to :class:`FitDivergedError`; ``result.skipped_steps`` records skipped steps.
    """

    def __init__(self, params: list[torch.Tensor], guide, on_divergence: str, result):
        if on_divergence not in ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be 'raise' or 'skip', got {on_divergence!r}")
        self.last_good = LastGood(params)
        self.guide, self.on_divergence, self.result = guide, on_divergence, result
        self.in_a_row = 0
        #: Steps between the copies named in messages (``None``: ``LAST_GOOD_EVERY``).
        self.copy_every: int | None = None

    def step_is_finite(self, step: int, epoch: int, value: float, grad_norm: float) -> bool:
        """``True``: take the update. ``False``: the step was skipped (``"skip"``); raises
        :class:`FitDivergedError` otherwise. The parameters are restored in both bad cases."""
        if math.isfinite(value) and math.isfinite(grad_norm):
            self.in_a_row = 0
            self.last_good.offer(step)
            return True
        message = divergence_message(step, epoch, value, self.guide, self.last_good.step)
        self.last_good.restore()
        if self.on_divergence == "raise":
            raise FitDivergedError(message, self.result)
        self.result.skipped_steps.append(step)
        self.in_a_row += 1
        if self.in_a_row >= MAX_CONSECUTIVE_SKIPS:
            raise FitDivergedError(
                f"{self.in_a_row} steps in a row had a non-finite loss or gradient "
                f"(on_divergence='skip' gives up); the last: {message}",
                self.result,
            )
        return False

    def final_check(self, value: float, last_step: int) -> None:
        """The loss after the last update: restore, then raise or warn, if it is not finite."""
        if math.isfinite(value):
            return
        message = (
            f"the parameters after the last update (step {last_step}) give a non-finite "
            f"loss ({value}). {restored_message(self.last_good.step, self.copy_every)}"
        )
        self.last_good.restore()
        if self.on_divergence == "raise":
            raise FitDivergedError(message, self.result)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def warn_skipped(self, steps: int) -> None:
        """One warning at the end of a fit that skipped steps."""
        skipped = self.result.skipped_steps
        if skipped:
            warnings.warn(
                f"{len(skipped)} of {steps} steps were skipped for a non-finite loss or gradient "
                f"(the first at step {skipped[0]}; all in result.skipped_steps). Consider a "
                "smaller lr or clip_grad_norm.",
                RuntimeWarning,
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
