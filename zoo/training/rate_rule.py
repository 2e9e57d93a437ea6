"""How a learning-rate sweep's losses give a rate (:mod:`zoo.training.rate` runs the sweep).

The data term, smoothed by a bias-corrected moving average, falls as the rate rises, then
flattens and climbs once the rate is too large for the network's fit. The chosen rate is
the lowest of three readings of that curve: the rate at its smoothed minimum divided by
:data:`DIVISOR`; :data:`STEEP_FACTOR` times the rate where it fell fastest; and
:data:`VALLEY_FACTOR` times the rate of its "valley" (about halfway along its longest
falling run, the suggestion of fastai's ``lr_find``). The minimum alone overshoots where
batch norm lets the sweep run far past the rates the fit can take, and the valley alone
undershoots where the curve falls until the sweep's end; each bounds the other. A data
term that never fell below its first value gives no rate to read (:func:`choose` returns
``None``), and the fit runs at the sweep's centre. The data term, not the whole loss: a
variational family's KL falls fastest at rates far above those at which the network still
learns, which would put the whole loss's minimum far past its best rate (a point estimate's
loss is nearly all data term). The constants are chosen on the sweeps and grids of
``benchmarks/fairness.py`` at ``cc5a66b`` and checked on two networks outside them
(``benchmarks/rate_rules.py`` at ``31084fa``; ``benchmarks/README.md`` at ``91a332b``).

The sweep is over once its smoothed data term, past the sweep's midpoint, has climbed back
above its first value (:func:`climbed_back`). Every reading of a prefix of the sweep is at or
below the reading of the whole (the minimum, the steepest fall and the valley only move to
later steps), which the warm-up's held states rely on (:mod:`zoo.training.warmup`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

__all__ = [
    "DIVISOR",
    "SMOOTHING",
    "STEEP_FACTOR",
    "VALLEY_FACTOR",
    "Landmarks",
    "choose",
    "climbed_back",
    "landmarks",
    "reached",
    "smoothed",
    "valley",
]

#: The chosen rate is the rate at the smoothed loss's minimum divided by this ...
DIVISOR = 4.0
#: ... at most the rate of the steepest fall times this ...
STEEP_FACTOR = 10.0
#: ... and at most the rate of the valley (halfway along the longest falling run) times this.
VALLEY_FACTOR = 4.0
#: The moving average's weight of the past (per step).
SMOOTHING = 0.8


def smoothed(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    """The bias-corrected exponential moving average of ``losses``."""
    out, avg = [], 0.0
    for i, value in enumerate(losses):
        avg = beta * avg + (1 - beta) * value
        out.append(avg / (1 - beta ** (i + 1)))
    return out


@dataclass(frozen=True)
class Landmarks:
    """What a rule reads of a sweep's data terms: ``smooth``, their bias-corrected moving
    average up to the first non-finite one; ``best``, the step of its minimum; ``steep``, the
    step that ends its steepest fall before the minimum (``best`` when there is none);
    ``valley``, the step about halfway along its longest falling run (:func:`valley`)."""

    smooth: list[float]
    best: int
    steep: int
    valley: int


def landmarks(losses: list[float]) -> Landmarks:
    """The :class:`Landmarks` of a sweep's data terms ``losses`` (at least one finite)."""
    usable = []
    for value in losses:
        if not math.isfinite(value):
            break
        usable.append(value)
    smooth = smoothed(usable)
    best = min(range(len(smooth)), key=smooth.__getitem__)
    falls = [smooth[i - 1] - smooth[i] for i in range(1, best + 1)]
    steep = 1 + max(range(len(falls)), key=falls.__getitem__) if falls else best
    return Landmarks(smooth, best, steep, valley(smooth))


def valley(smooth: list[float]) -> int:
    """The step about halfway along the longest falling run of ``smooth``: the longest
    subsequence of steps whose values fall strictly (not necessarily adjacent steps, so a
    noisy fall counts as one; the earliest ending wins a tie), of ``L`` steps ending at step
    ``e``, read at ``s + floor(t) + floor(t / 2)``, ``s = e - L`` and ``t = L / 3`` (fastai's
    ``lr_find`` "valley" suggestion: a rate well inside the fall, not at its end)."""
    n = len(smooth)
    run = [1] * n  # the longest falling subsequence ending at each step
    for i in range(1, n):
        run[i] = 1 + max((run[j] for j in range(i) if smooth[j] > smooth[i]), default=0)
    end = max(range(n), key=run.__getitem__)
    start = end - run[end]  # the step before the run's first (-1 for a run from step 0)
    third = (end - start) / 3
    return max(start + int(third) + int(third / 2), 0)


def choose(rates: list[float], losses: list[float]) -> tuple[float, float | None]:
    """``(lr_min, lr)`` of a sweep (see the module docstring) whose step ``i`` ran at
    ``rates[i]`` and scored ``losses[i]`` (the data terms): the rate at the smoothed minimum and
    the rate chosen (``None`` when the smoothed losses never fell below their first value:
    the caller's centre rate). Non-finite losses end the usable part of the sweep; fewer than
    three usable steps give the lowest rate divided by :data:`DIVISOR`."""
    if sum(1 for _ in itertools.takewhile(math.isfinite, losses)) < 3:
        return rates[0], rates[0] / DIVISOR  # the first rates already diverge
    marks = landmarks(losses)
    if marks.best == 0:  # it never fell below its start: no rate to read, the centre it is
        return rates[0], None
    lr = min(
        rates[marks.best] / DIVISOR,
        rates[marks.steep] * STEEP_FACTOR,
        rates[marks.valley] * VALLEY_FACTOR,
    )
    return rates[marks.best], max(lr, rates[0])


def reached(rates: list[float], lr: float | None) -> int:
    """The sweep's steps at rates up to ``lr`` (none for ``None``): the rates rise."""
    return 0 if lr is None else sum(1 for r in rates if r <= lr * (1 + 1e-9))


def climbed_back(losses: list[float], steps: int) -> bool:
    """Whether a sweep of ``steps`` steps scoring ``losses`` (its data terms so far, all
    finite) is over: past its midpoint (rates above about three times its centre), its smoothed
    data term fell below its first value and has since climbed back above it. The rates only
    rise from there, so the choice is read (the idea of the divergence stop of fastai's
    ``lr_find`` and ``torch-lr-finder``, measured against the start, not a multiple of the
    minimum, as a regression's data term may be negative). Before the midpoint a climb is the
    minibatches' noise at rates too low to diverge, not the end of the sweep."""
    smooth = smoothed(losses)
    return 2 * len(losses) > steps and min(smooth) < smooth[0] < smooth[-1]
