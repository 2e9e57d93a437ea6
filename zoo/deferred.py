"""The divergence check without a host synchronisation per step.

Reading a step's loss on the host (``float(loss)``) waits until the device has finished the
step, so on a GPU the host cannot queue the next step's kernels meanwhile: for a small network
that wait is a large part of the step. :class:`DeferredGuard` keeps the per-step decision on the
device and reads the results in groups:

- each step computes ``finite = isfinite(loss) & isfinite(grad_norm)`` on the device and hands
  its negation to the optimiser as ``found_inf``: torch's fused Adam, AdamW and SGD kernels then
  leave the parameters, moments and step count unchanged (:func:`supports_device_skip`), so a
  non-finite loss or gradient never reaches the parameters, without the host looking;
- every ``every`` steps (and at epoch ends, checkpoints, the last step and Ctrl-C) one read
  brings the group's losses and gradient norms to the host, where they are settled in order as
  :class:`zoo.divergence.DivergenceGuard` settles one step: finite losses join the history,
  non-finite steps raise :class:`~zoo.divergence.FitDivergedError` (naming the first) or are
  recorded as skipped.

What a diverged fit returns is the same as with the per-step check: the guide goes back to a
copy of parameters whose loss and gradients were finite. Copies are taken at group boundaries
(before a group's first update) and count as good once that first step is seen to be finite;
two are kept, the verified one and the candidate. With ``on_divergence="raise"`` the steps
after the first non-finite one in a group were taken on the device but are discarded: the
history ends before it and the guide is restored. Two differences from the per-step check: a
learning-rate schedule advances on skipped steps too (the host does not know yet), and with
``on_divergence="skip"`` the guide is restored only when a group ends on a non-finite step
(earlier ones were followed by finite steps from parameters the skip left unchanged).
"""

from __future__ import annotations

import math

import torch

from zoo.divergence import MAX_CONSECUTIVE_SKIPS, DivergenceGuard, FitDivergedError
from zoo.divergence import divergence_message as _message

#: Steps between the host's reads of the losses on CUDA under ``check_every="auto"``.
CUDA_CHECK_EVERY = 20
#: The optimisers whose fused kernels skip an update on a device-side ``found_inf`` flag.
DEVICE_SKIP_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def supports_device_skip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can skip an update on a flag held on the device: torch's own
    Adam, AdamW and SGD running fused (``zoo.fit`` builds them so by default)."""
    return type(optimizer) in DEVICE_SKIP_OPTIMIZERS and all(
        g.get("fused") for g in optimizer.param_groups
    )


def resolve_check_every(
    check_every: int | str,
    device: torch.device,
    optimizer: torch.optim.Optimizer,
    distributed: bool,
    graph: bool = False,
) -> int:
    """Steps between reads of the loss on the host: ``"auto"`` reads every step on the CPU
    (where a read costs nothing), in distributed fits (whose ranks meet every step anyway) and
    with optimisers that cannot skip on the device; every :data:`CUDA_CHECK_EVERY` steps on
    CUDA (or with a CUDA graph, ``graph``) otherwise. An explicit count is returned as it is:
    :class:`DeferredGuard` refuses an optimiser that cannot skip, and ``zoo.fit`` a count above
    1 for a distributed fit before it starts."""
    if check_every == "auto":
        on_device = graph or device.type != "cpu"
        skips = supports_device_skip(optimizer)
        return CUDA_CHECK_EVERY if on_device and skips and not distributed else 1
    return int(check_every)


def validate_check_every(check_every) -> None:
    """Refuse a ``check_every`` that is neither ``"auto"`` nor a positive integer."""
    if check_every == "auto":
        return
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every must be 'auto' or a positive integer, got {check_every!r}")


class DeferredGuard(DivergenceGuard):
    """:class:`~zoo.divergence.DivergenceGuard` with the per-step test on the device and the
    host's read every ``every`` steps (see the module's notes).

    Parameters
    ----------
    params, guide, on_divergence, result
        As for :class:`~zoo.divergence.DivergenceGuard`.
    optimizer : torch.optim.Optimizer
        Fused Adam, AdamW or SGD (:func:`supports_device_skip`); its ``found_inf`` is set to
        this guard's flag.
    every : int
        Steps between reads; the trainer also reads at epoch ends, checkpoints and the end.
    """

    def __init__(self, params, guide, on_divergence: str, result, optimizer, every: int):
        super().__init__(params, guide, on_divergence, result)
        if not supports_device_skip(optimizer):
            raise ValueError(
                "check_every > 1 and cuda_graph=True need an optimiser that skips a non-finite "
                "update on the device: optimizer='adam', 'adamw' or 'sgd' (built fused, the "
                f"default); got {type(optimizer).__name__}"
            )
        device = params[0].device
        self.every = self.copy_every = int(every)
        #: 1.0 when this step's loss or gradient norm is not finite (read by the fused kernels).
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        optimizer.found_inf = self.found_inf
        self.pending: list[tuple[int, int, torch.Tensor]] = []  # (step, epoch, [loss, norm])
        self.candidate = [torch.empty_like(p) for p in self.last_good.params]
        self.candidate_step: int | None = None

    @property
    def due(self) -> bool:
        """A group is complete."""
        return len(self.pending) >= self.every

    @torch.no_grad()
    def begin(self, step: int) -> None:
        """Copy the parameters as they are before step ``step``: the candidate that step's
        finite loss will verify."""
        torch._foreach_copy_(self.candidate, self.last_good.params)
        self.candidate_step = step

    @torch.no_grad()
    def mark(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Set the optimiser's skip flag from this step's loss and gradient norm, on the device
        (no host read; safe inside a CUDA graph)."""
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
        self.found_inf.copy_(finite.logical_not())

    def remember(self, step: int, epoch: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Queue a step's loss and gradient norm (copied: the tensors may be reused)."""
        pair = torch.stack([loss.detach(), grad_norm.detach().to(loss.dtype)])
        self.pending.append((step, epoch, pair))

    def flush(self, state) -> float:
        """Read the queued steps (one host synchronisation) and settle them in order: finite
        losses join ``state``'s history, non-finite steps raise or are recorded as skipped.
        Returns the last step's loss (``nan`` when none is queued)."""
        if not self.pending:
            return math.nan
        pending, self.pending = self.pending, []
        values = torch.stack([pair for *_, pair in pending]).tolist()
        first_bad = None
        for (step, epoch, _), (value, norm) in zip(pending, values):
            if math.isfinite(value) and math.isfinite(norm):
                if step == self.candidate_step:
                    self._verify()
                if first_bad is None or self.on_divergence == "skip":
                    self.in_a_row = 0
                    state.losses.append(value)
                    state.epoch_partial.append(value)
                continue
            if first_bad is None:
                first_bad = (step, epoch, value, step == pending[-1][0])
            if self.on_divergence == "raise":
                continue
            self.result.skipped_steps.append(step)
            self.in_a_row += 1
            if self.in_a_row >= MAX_CONSECUTIVE_SKIPS:
                self.last_good.restore()
                raise FitDivergedError(
                    f"{self.in_a_row} steps in a row had a non-finite loss or gradient "
                    f"(on_divergence='skip' gives up); the last at step {step}",
                    self.result,
                )
        if first_bad is not None:
            self._settle_bad(state, *first_bad, ended_bad=not math.isfinite(sum(values[-1])))
        # The candidate is now verified or stale (its step was read). A new one at most every
        # `every` steps: reads come more often at epoch ends, checkpoints and with callbacks.
        good = self.last_good.step
        self.candidate_step = None
        if good is None or state.step - good >= self.every:
            self.begin(state.step)
        return values[-1][0]

    def _verify(self) -> None:
        """The candidate's parameters gave a finite loss: it becomes the copy to go back to."""
        self.last_good.copies, self.candidate = self.candidate, self.last_good.copies
        self.last_good.step = self.candidate_step
        self.candidate_step = None

    def _settle_bad(self, state, step: int, epoch: int, value: float, last: bool, ended_bad: bool):
        """Raise for the first non-finite step (``"raise"``), or go back to the verified copy
        when the group ended on a non-finite step (``"skip"``)."""
        if self.on_divergence == "raise":
            # The gradients in .grad are the bad step's only when it was the group's last.
            guide = self.guide if last else None
            message = _message(step, epoch, value, guide, self.last_good.step, self.every)
            self.last_good.restore()
            state.step = step
            raise FitDivergedError(message, self.result)
        if ended_bad:
            self.last_good.restore()
