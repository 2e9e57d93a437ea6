"""The step size of a fit, measured on its own objective: a learning-rate range test.

A minibatch fit given no ``lr`` (long enough, :func:`sweep_length`; not small regression
data's full-batch recipe, which keeps its own rate: :mod:`zoo.training.recipes`) does not run
at a constant default: before its first step it sweeps (Smith 2017, "Cyclical learning rates
for training neural networks", section 3.3; the idea of fastai's ``lr_find`` and
``torch-lr-finder``, which take a plain network and loss, not a guide and an ELBO) and runs at
what the sweep found.

The sweep
    Up to ``steps`` optimiser steps of the fit's own optimiser, objective and minibatches, from
    the fit's initial state, at rates rising geometrically from ``base / LOW`` to
    ``base * HIGH`` (``base``: the task's default rate times the family's scale). Each step
    records the loss (``-ELBO``) and its data term, ``-E_q[log p(y | w)]`` on the full-data
    scale: the loss less its KL part, evaluated on the same weight draw. The sweep stops at a
    non-finite step (the step engine skips it) and once its smoothed data term, having fallen,
    climbs back above its first value (:func:`climbed_back`): the rates only rise from there.
The warm-up it leaves
    The sweep's first ``kept`` steps ran at rates up to the chosen one: a warm-up the fit
    keeps. The parameters, batch norm's running statistics and the optimiser's state are put
    back to their state after those steps (the start when none is), and every random generator
    to where the sweep began; the steps above the chosen rate are the test's cost. The fit
    proper is then the fit given the chosen ``lr`` from that state
    (``tests/zoo/training/test_rate.py`` replays it step by step). The states the choice may
    still reach are held during the sweep on their device, within a bound
    (:mod:`zoo.training.warmup`); past it, the latest held is put back.
The rule
    The data term, smoothed by a bias-corrected moving average, falls as the rate rises, then
    flattens and climbs once the rate is too large for the network's fit. The chosen rate is
    the lowest of three readings of that curve: the rate at its smoothed minimum divided by
    :data:`DIVISOR`; :data:`STEEP_FACTOR` times the rate where it fell fastest; and
    :data:`VALLEY_FACTOR` times the rate of its "valley" (about halfway along its longest
    falling run, the suggestion of fastai's ``lr_find``). The minimum alone overshoots where
    batch norm lets the sweep run far past the rates the fit can take, and the valley alone
    undershoots where the curve falls until the sweep's end; each bounds the other. A data
    term that never fell below its first value gives no rate to read, and the fit runs at
    ``base``. The data term, not the whole loss: a variational family's KL falls fastest at
    rates far above those at which the network still learns (it would put the minimum of the
    whole loss 5 to 40 times past the best rate on MNIST, where a point estimate's is 1.3
    times past it). The constants are chosen on the sweeps and grids of
    ``benchmarks/fairness.py`` and checked on two networks outside them
    (``benchmarks/rate_rules.py``; ``benchmarks/README.md``).
The budget
    The sweep's steps are charged to the fit: a fit of ``T`` steps runs ``T - steps`` after it
    (``kept`` of the sweep's steps and those make its trajectory), at the chosen rate decaying
    tenfold over them (the default schedule); its seconds count in the fit's ``wall_time``. A
    fit shorter than :data:`MIN_FIT_STEPS` keeps the task's rate (``lr="auto"`` is refused
    there, before any step: the sweep would be most of the fit).

``result.options["lr_test"]`` records the sweep: its steps, rates, losses and data terms, the
rate at the minimum (``lr_min``), the rate it chose (``lr``) and its seconds. A distributed fit
sweeps on the ranks' mean gradients and losses, so every rank chooses the same rate. A resumed
fit reads the chosen rate from its checkpoint and does not sweep again.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from zoo.inference.objective import Objective, named_parameters
from zoo.runtime.distributed import Ranks
from zoo.storage import files
from zoo.training.recipes import Length
from zoo.training.rules import StepPlan
from zoo.training.step import Stepper
from zoo.training.warmup import Warmup

__all__ = [
    "DIVISOR",
    "HIGH",
    "LOW",
    "Landmarks",
    "MIN_FIT_STEPS",
    "Measured",
    "RateTest",
    "choose",
    "landmarks",
    "measure",
    "run_test",
    "STEEP_FACTOR",
    "VALLEY_FACTOR",
    "sweep_length",
    "valley",
]

#: The sweep's rates rise geometrically from ``base / LOW`` to ``base * HIGH``, ``base`` the
#: task's default rate times the family's scale.
LOW, HIGH = 10.0, 100.0
#: The chosen rate is the rate at the smoothed loss's minimum divided by this ...
DIVISOR = 4.0
#: ... at most the rate of the steepest fall times this ...
STEEP_FACTOR = 10.0
#: ... and at most the rate of the valley (halfway along the longest falling run) times this.
VALLEY_FACTOR = 4.0
#: The moving average's weight of the past (per step).
SMOOTHING = 0.8
#: The sweep's length: a sixth of the fit's steps, within these bounds.
FRACTION = 6
MIN_TEST_STEPS, MAX_TEST_STEPS = 16, 60
#: A fit of fewer steps keeps the fixed default rate (``lr="auto"`` refuses it).
MIN_FIT_STEPS = 4 * MIN_TEST_STEPS


def sweep_length(total: int) -> int | None:
    """The sweep's steps for a fit of ``total`` steps, or ``None`` when the fit is too short
    to measure its rate (fewer than :data:`MIN_FIT_STEPS` steps)."""
    if total < MIN_FIT_STEPS:
        return None
    return int(min(MAX_TEST_STEPS, max(MIN_TEST_STEPS, total // FRACTION)))


@dataclass(frozen=True)
class RateTest:
    """A finished sweep of ``steps`` steps (at most :func:`sweep_length`'s; fewer when it
    stopped early): ``rates``, ``losses`` (``-ELBO`` estimates) and ``data_losses`` (their data
    terms, ``-E_q[log p(y | w)]``) step by step, the rate at the data term's smoothed minimum
    (``lr_min``), the rate chosen (``lr``, at least the sweep's lowest unless its first steps
    diverged), the sweep's wall time (``seconds``) and the steps the fit keeps as its warm-up
    (``kept``: those at rates up to ``lr``; 0 in the records of releases before it). ``base``
    is the rate the span is centred on."""

    steps: int
    base: float
    rates: list[float]
    losses: list[float]
    data_losses: list[float]
    lr_min: float
    lr: float
    seconds: float
    kept: int = 0

    def record(self) -> dict:
        """The plain record ``result.options["lr_test"]`` holds."""
        return asdict(self)


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


def run_test(
    objective: Objective,
    batches,
    optimizer: torch.optim.Optimizer,
    *,
    base: float,
    steps: int,
    generator: torch.Generator,
    accumulate: int = 1,
    per_example: bool = False,
    clip_grad_norm: float | None = None,
    ranks: Ranks | None = None,
) -> RateTest:
    """Sweep up to ``steps`` rates from ``base / LOW`` to ``base * HIGH`` with ``optimizer``
    (the fit's, its groups at ``base`` times their factors) on ``objective``, then put back
    the parameters, every buffer (running statistics) and the optimiser's state to their state
    after the sweep's ``kept`` steps at rates up to the chosen one, and every random generator
    (``generator``, the shuffle's, among them) to its start, with the chosen rate in the
    optimiser's groups. ``batches`` are the fit's
    (:class:`zoo.data.batches.Batches`), ``accumulate`` of them a step; ``ranks`` average the
    gradients and losses of a distributed fit, so that every rank decides the same."""
    ranks = ranks if ranks is not None else Ranks()
    model, guide = objective.model, objective.guide
    state = [p for _, p in named_parameters(guide, model)] + _buffers(model, guide)
    factors = [g["lr"] / base for g in optimizer.param_groups]
    rng = files.rng_state(generator)
    warmup = Warmup(state, optimizer)
    ratio = LOW * HIGH
    rates = [base / LOW * ratio ** (i / max(steps - 1, 1)) for i in range(steps)]
    # the step engine's body, tested on the host every step; a non-finite step is skipped
    plan = StepPlan(check_every=1, cuda_graph=False, accumulate=accumulate, threads=None)
    stepper = Stepper.build(objective, optimizer, num_data=len(batches), on_divergence="skip",
                            plan=plan, clip_grad_norm=clip_grad_norm, per_example=per_example,
                            ranks=ranks)  # fmt: skip
    kl = _KLParts(objective, len(batches))
    start, losses, fits = time.perf_counter(), [], []
    stream = _cycle(batches)
    for i, rate in enumerate(rates):
        for group, factor in zip(optimizer.param_groups, factors):
            group["lr"] = rate * factor
        optimizer.zero_grad(set_to_none=True)
        inputs = [next(stream) for _ in range(accumulate)]
        loss, _ = stepper.body(inputs, kl.loss_of)
        value = float(loss)  # the ranks' mean, read by the body's host test already
        fit = value - ranks.mean(kl.taken(inputs), i)
        losses.append(value if math.isfinite(value) else math.inf)
        fits.append(fit if math.isfinite(fit) else math.inf)
        if not (math.isfinite(value) and stepper.last_taken):
            break
        warmup.offer(i + 1, reached(rates[: i + 1], choose(rates[: i + 1], fits)[1]))
        if climbed_back(fits, steps):
            break
    lr_min, chosen = choose(rates[: len(fits)], fits)
    lr = base if chosen is None else chosen
    kept = warmup.put_back(reached(rates[: len(fits)], lr))
    files.set_rng_state(rng, generator)
    optimizer.zero_grad(set_to_none=True)
    for group, factor in zip(optimizer.param_groups, factors):
        group["lr"] = lr * factor
    return RateTest(
        steps=len(losses),
        base=base,
        rates=rates[: len(losses)],
        losses=losses,
        data_losses=fits,
        lr_min=lr_min,
        lr=lr,
        seconds=time.perf_counter() - start,
        kept=kept,
    )


class _KLParts:
    """The loss of a sweep's minibatch, evaluated eagerly, and its KL part on the same weight
    draw (the generators put back between the two): the loss less it is the data term,
    ``-E_q[log p(y | w)]`` on the full-data scale."""

    def __init__(self, objective: Objective, num_data: int):
        self.objective, self.num_data = objective, num_data
        self.parts: list[float] = []

    def loss_of(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        objective = self.objective
        before = files.torch_rng_state()
        loss = objective.loss(x, y, self.num_data, step=0, eager=True)
        after = files.torch_rng_state()
        files.set_torch_rng_state(before)  # the same draws, the likelihood scaled to zero
        self.parts.append(float(objective.kl(x, y)) * objective.kl_weight_at(0))
        files.set_torch_rng_state(after)
        return loss

    def taken(self, inputs: list) -> float:
        """The KL part of the step just taken on ``inputs`` (its minibatches' shares)."""
        sizes = [len(x) for x, _ in inputs]
        parts, self.parts = self.parts[-len(sizes) :], []
        return sum(p * n / sum(sizes) for p, n in zip(parts, sizes))


def _buffers(model, guide) -> list[torch.Tensor]:
    """Every buffer of the model and guide, which a step may change (batch norm's running
    statistics and their count)."""
    found = [b for owner in (model, guide) if isinstance(owner, torch.nn.Module)
             for b in owner.buffers()]  # fmt: skip
    return list({id(t): t for t in found}.values())


def _cycle(batches) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The fit's minibatches epoch after epoch."""
    epoch = 0
    while True:
        empty = True
        for batch in batches.epoch(epoch):
            empty = False
            yield batch
        if empty:
            raise RuntimeError("the data gave no minibatch for the rate test")
        epoch += 1


@dataclass(frozen=True)
class Measured:
    """A fit's length after its rate test: ``length`` with the chosen ``lr``, the steps left
    to the fit proper (``total``) and the test's ``record`` (``result.options["lr_test"]``)."""

    length: Length
    total: int
    record: dict


def measure(objective, batches, opt, plan, s, total: int, resumed, generator, ranks):
    """The rate test of a fit (``s``: its settings, ``total``: its steps) when its length
    asks for one (:attr:`zoo.training.recipes.Length.measure`): a :class:`Measured`, with the
    chosen rate set in ``opt``'s groups; ``None`` when the rate is not measured (given, a
    convergence rule's, a trained start's, a fit too short). A resumed fit takes the rate its
    checkpoint recorded. ``lr="auto"`` on a fit too short is refused here, before any step."""
    length = s.length
    if length.measure is None:
        return None
    if resumed is not None:  # the checkpoint's optimiser state holds the rate; its record:
        record = (resumed.get("options") or {}).get("lr_test")
        return None if record is None else _measured(length, total, record)
    steps = sweep_length(total)
    if steps is None:
        if length.measure == "required":
            raise ValueError(
                f'lr="auto" measures the rate with a range test of at least {MIN_TEST_STEPS} '
                f"steps charged to the fit, but this fit takes only {total} step(s) (at least "
                f"{MIN_FIT_STEPS} are needed, so that the test is at most a quarter of the fit): "
                "give a longer fit (num_steps= or epochs=), or a rate (lr=...)"
            )
        return None
    test = run_test(
        objective,
        batches,
        opt,
        base=length.lr,
        steps=steps,
        generator=generator,
        accumulate=plan.accumulate,
        per_example=s.optim.per_example,
        clip_grad_norm=s.optim.clip_grad_norm,
        ranks=ranks,
    )
    return _measured(length, total, test.record())


def _measured(length, total: int, record: dict) -> Measured:
    """The fit proper after a sweep: the chosen rate, and the steps the sweep left."""
    left = max(total - int(record["steps"]), 1)
    measured = dataclasses.replace(
        length,
        lr=float(record["lr"]),
        num_steps=left,
        recipe=length.recipe + ", rate measured",
        lr_rule="range test",
    )
    return Measured(length=measured, total=left, record=record)
