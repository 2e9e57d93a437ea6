"""When a fit has converged: ``zoo.fit(num_steps="auto")``'s stopping rule.

``num_steps="auto"`` applies :class:`Convergence`'s defaults;
``num_steps=Convergence(window=..., tolerance=..., patience=..., cap=...)`` sets them. The rule
reads the fit's own history, the ``-ELBO`` estimate of every accepted step (``result.losses``,
full-data scale), in windows of ``window`` steps. At the end of window
``k`` it compares the mean loss of that window, ``L_k``, with the previous window's,
``L_{k-1}``: the fit has stalled in window ``k`` when

    L_{k-1} - L_k < tolerance * max(|L_{k-1}|, 1),

and it stops once ``patience`` consecutive windows have stalled, or at ``cap`` steps. A window
mean averages away the step-to-step Monte Carlo noise of the estimates (its standard error is
the steps' standard deviation over ``sqrt(window)``), so a curve that still falls steadily
under noise goes on, and one that has levelled off stops. Because the rule only reads the
losses, a resumed fit (whose checkpoint holds them) continues with the same windows.

``result.options["stopped"]`` says why a fit ended: ``"converged"`` (this rule), ``"cap"``,
``"num_steps"`` (the given length), ``"callback"`` or ``"interrupted"``, and
``result.options["stopped_at"]`` the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Convergence:
    """The stopping rule of ``num_steps="auto"`` (see the module docstring).

    Attributes
    ----------
    window : int
        Steps per window; a window mean should hold enough steps to average the noise away.
    tolerance : float
        Relative improvement of one window's mean loss over the previous one below which a
        window has stalled.
    patience : int
        Consecutive stalled windows that stop the fit.
    cap : int
        The most steps, converged or not.
    """

    window: int = 250
    tolerance: float = 1e-3
    patience: int = 2
    cap: int = 20_000

    def __post_init__(self):
        for name in ("window", "patience", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Convergence.{name} must be a positive integer, got {value!r}")
        if not self.tolerance >= 0:
            raise ValueError(f"Convergence.tolerance must be >= 0, got {self.tolerance!r}")

    def due(self, step: int) -> bool:
        """Whether the rule reads the losses after ``step`` steps (a window's end)."""
        return step % self.window == 0

    def converged(self, losses: Sequence[float]) -> bool:
        """Whether the last ``patience`` complete windows of ``losses`` have each stalled."""
        w = self.window
        windows = len(losses) // w
        if windows < self.patience + 1:
            return False
        means = [sum(losses[i * w : (i + 1) * w]) / w for i in range(windows)]
        recent = means[-(self.patience + 1) :]
        return all(
            before - after < self.tolerance * max(abs(before), 1.0)
            for before, after in zip(recent, recent[1:])
        )


def resolve(num_steps) -> tuple[int | None, Convergence | None]:
    """``(num_steps, rule)`` of ``zoo.fit``'s ``num_steps``: ``"auto"`` is the default
    :class:`Convergence`, a ``Convergence`` itself, each with its cap as the most steps; a
    number or None stays as it is, without a rule."""
    if isinstance(num_steps, str):
        if num_steps != "auto":
            raise ValueError(
                f"num_steps must be a positive integer, 'auto' or a zoo.Convergence, got "
                f"{num_steps!r}"
            )
        num_steps = Convergence()
    if isinstance(num_steps, Convergence):
        return num_steps.cap, num_steps
    return num_steps, None
