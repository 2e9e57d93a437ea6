"""When a fit has converged: ``zoo.fit(num_steps="auto")``'s stopping rule.

``num_steps="auto"`` applies :class:`Convergence`'s defaults;
``num_steps=Convergence(window=..., tolerance=..., patience=..., cap=..., decays=...,
factor=...)`` sets them. The rule reads the fit's own history, the ``-ELBO`` estimate of every
accepted step (``result.losses``, full-data scale: a sum over the ``N`` training examples), in
windows of ``window`` steps. With ``L_k`` the mean loss of window ``k``, the window has stalled
when

    L_{k-1} - L_k < tolerance * N,

an improvement of less than ``tolerance`` nats per training example. A window mean averages
away the step-to-step Monte Carlo noise of the estimates (its standard error is the steps'
standard deviation over ``sqrt(window)``), so a curve that still falls steadily under noise goes
on, and one that has levelled off stalls. The threshold is absolute, per example, not relative
to ``|L|``: an ELBO can carry a large constant (MC dropout's ``-n log sigma``) that says
nothing about progress.

``patience`` consecutive stalled windows make a *plateau*. At each of the first ``decays``
plateaus the learning rate is multiplied by ``factor`` (tenfold lower by default: a constant
rate leaves the parameters jittering at the noise level of their gradients, and a lower one
lets them settle) and the count of stalled windows starts again; the plateau after them ends
the fit, and ``cap`` steps end it in any case. Because the rule only reads the losses (the
plateaus, hence the rate, are replayed from them), a resumed fit, whose checkpoint holds them,
continues with the same windows and the same rate.

``result.options["stopped"]`` says why a fit ended: ``"converged"`` (this rule), ``"cap"``,
``"num_steps"`` (the given length), ``"callback"`` or ``"interrupted"``, and
``result.options["stopped_at"]`` the step, and ``result.options["lr_cuts"]`` the steps at which
the rate was cut. A fit of a given length (no rule) reports ``result.options["plateau_at"]``: the
first step at which the default rule would have found a plateau, or ``None`` when its loss was
still improving at the end (give it more steps, or ``num_steps="auto"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zoo.arguments import check_int


@dataclass(frozen=True)
class Convergence:
    """The stopping rule of ``num_steps="auto"`` (see the module docstring).

    Attributes
    ----------
    window : int
        Steps per window; a window mean should hold enough steps to average the noise away.
    tolerance : float
        Improvement of one window's mean ``-ELBO`` over the previous one, in nats per training
        example, below which a window has stalled.
    patience : int
        Consecutive stalled windows that make a plateau.
    cap : int
        The most steps, converged or not.
    decays : int
        Plateaus at which the learning rate is cut before one ends the fit (0: the first
        plateau ends it, at a constant rate).
    factor : float
        The learning rate's factor at each cut.
    """

    window: int = 250
    tolerance: float = 1e-3
    patience: int = 2
    cap: int = 20_000
    decays: int = 1
    factor: float = 0.1

    def __post_init__(self):
        for name in ("window", "patience", "cap"):
            value = getattr(self, name)
            check_int(f"Convergence.{name}", value, 1)
        check_int("Convergence.decays", self.decays, 0, meaning="rate cuts before the stop")
        if not self.tolerance >= 0:
            raise ValueError(f"Convergence.tolerance must be >= 0, got {self.tolerance!r}")
        if not 0 < self.factor <= 1:
            raise ValueError(f"Convergence.factor must lie in (0, 1], got {self.factor!r}")

    def due(self, step: int) -> bool:
        """Whether the rule reads the losses after ``step`` steps (a window's end)."""
        return step % self.window == 0

    def plateaus(self, losses: Sequence[float], size: int = 1) -> list[int]:
        """The steps (window ends) at which ``losses`` reached a plateau, for a fit on ``size``
        examples: ``patience`` stalled windows in a row, counted afresh after each plateau."""
        w = self.window
        means = [sum(losses[i * w : (i + 1) * w]) / w for i in range(len(losses) // w)]
        found, stalled = [], 0
        for k in range(1, len(means)):
            stalled = stalled + 1 if means[k - 1] - means[k] < self.tolerance * size else 0
            if stalled == self.patience:
                found.append((k + 1) * w)
                stalled = 0
        return found

    def converged(self, losses: Sequence[float], size: int = 1) -> bool:
        """Whether ``losses`` have reached the plateau that ends the fit (the one after
        ``decays`` rate cuts)."""
        return len(self.plateaus(losses, size)) > self.decays


class ConvergenceTracker:
    """A fit's use of a :class:`Convergence` rule on ``size`` examples: the verdict at each
    window's end, and the learning-rate factor of the rate cuts so far (a ``LambdaLR`` factor,
    ``step -> float``)."""

    def __init__(self, rule: Convergence, size: int):
        self.rule, self.size = rule, int(size)
        self.plateaus: list[int] = []

    @property
    def cuts(self) -> list[int]:
        """The steps at which the rate was cut so far."""
        return self.plateaus[: self.rule.decays]

    def due(self, step: int) -> bool:
        """Whether the rule reads the losses after ``step`` steps (a window's end)."""
        return self.rule.due(step)

    def update(self, losses: Sequence[float]) -> bool:
        """Replay the rule over ``losses``: set the rate cuts, and say whether the fit ends."""
        self.plateaus = self.rule.plateaus(losses, self.size)
        return len(self.plateaus) > self.rule.decays

    def lr_factor(self, step: int) -> float:
        """The learning rate's factor from the rate cuts so far (``factor ** len(cuts)``)."""
        return self.rule.factor ** len(self.cuts)


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
