"""The step size of a fit, measured on its own objective: a learning-rate range test.

A minibatch fit given no ``lr`` (long enough, :func:`sweep_length`; not small regression
data's full-batch recipe, which keeps its own rate: :mod:`zoo.training.recipes`) does not run
at a constant default: before its first step it sweeps (Smith 2017, "Cyclical learning rates
for training neural networks", section 3.3; the idea of fastai's ``lr_find`` and
``torch-lr-finder``, which take a plain network and loss, not a guide and an ELBO) and runs at
what the sweep found.

The sweep
    Up to ``steps`` optimiser steps of the fit's own optimiser, objective (compiled where the
    fit's is) and minibatches, from the fit's initial state, at rates rising geometrically from
    ``base / LOW`` to ``base * HIGH`` (``base``: the task's default rate times the family's
    scale). Each step records the loss (``-ELBO``) and its data term, ``-E_q[log p(y | w)]``
    on the full-data scale: the loss less its KL part, read from the same evaluation (the
    gradient of the likelihood's scale, :meth:`zoo.Objective.loss_with_data_term`). The sweep
    stops at a non-finite step (the step engine skips it) and once its smoothed data term,
    having fallen, climbs back above its first value (:func:`climbed_back`): the rates only
    rise from there.
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
    What rate a sweep's data terms give is :mod:`zoo.training.rate_rule`'s
    (:func:`~zoo.training.rate_rule.choose`); a data term that never fell below its first
    value gives no rate to read, and the fit runs at ``base``.
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
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from zoo.arguments import is_int
from zoo.inference.objective import Objective, named_parameters
from zoo.runtime.distributed import Ranks
from zoo.storage import files
from zoo.training.optim import set_rate
from zoo.training.rate_rule import choose, climbed_back, reached
from zoo.training.recipes import Length
from zoo.training.rules import StepPlan
from zoo.training.step import Stepper
from zoo.training.warmup import Warmup

__all__ = [
    "HIGH",
    "LOW",
    "MIN_FIT_STEPS",
    "Measured",
    "RateTest",
    "measure",
    "run_test",
    "sweep_length",
]

#: The sweep's rates rise geometrically from ``base / LOW`` to ``base * HIGH``, ``base`` the
#: task's default rate times the family's scale.
LOW, HIGH = 10.0, 100.0
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
    rng = files.rng_state(generator)
    warmup = Warmup(state, optimizer)
    ratio = LOW * HIGH
    rates = [base / LOW * ratio ** (i / max(steps - 1, 1)) for i in range(steps)]
    # the step engine's body, tested on the host every step; a non-finite step is skipped
    plan = StepPlan(check_every=1, cuda_graph=False, accumulate=accumulate, threads=None)
    stepper = Stepper.build(objective, optimizer, num_data=len(batches), on_divergence="skip",
                            plan=plan, clip_grad_norm=clip_grad_norm, per_example=per_example,
                            ranks=ranks)  # fmt: skip
    terms = _DataTerms(objective, len(batches), per_example)
    start, losses, fits = time.perf_counter(), [], []
    stream = _cycle(batches)
    for i, rate in enumerate(rates):
        set_rate(optimizer, rate)
        optimizer.zero_grad(set_to_none=True)
        inputs = [next(stream) for _ in range(accumulate)]
        loss, _ = stepper.body(inputs, terms.loss_of)
        value = float(loss)  # the ranks' mean, read by the body's host test already
        fit = ranks.mean(terms.taken(), i)
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
    set_rate(optimizer, lr)
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


class _DataTerms:
    """The loss of a sweep's minibatch, evaluated as the fit evaluates it (compiled where the
    fit is), and its data term ``-E_q[log p(y | w)]`` on the full-data scale, read from the
    same evaluation (:meth:`zoo.Objective.loss_with_data_term`: the gradient of the
    likelihood's scale)."""

    def __init__(self, objective: Objective, num_data: int, per_example: bool):
        self.objective, self.num_data = objective, num_data
        # the factor of the step's backward on each minibatch's loss, beside its share
        self.factor = 1.0 / num_data if per_example else 1.0
        self.leaves: list[torch.Tensor] = []

    def loss_of(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss, leaf = self.objective.loss_with_data_term(x, y, self.num_data)
        self.leaves.append(leaf)
        return loss

    def taken(self) -> float:
        """The data term of the step just taken: ``sum_i share_i * s_i * D_i`` over its
        minibatches (``s_i = N / B_i``; the backward gave each leaf ``share_i * factor * D_i``),
        as the step's loss weighs them."""
        leaves, self.leaves = self.leaves, []
        grads = [leaf.detach() * leaf.grad for leaf in leaves if leaf.grad is not None]
        return float(torch.stack(grads).sum()) / self.factor if grads else 0.0


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
        options = resumed.get("options") or {}
        record = options.get("lr_test")
        check_record(record, options.get("lr_rule"), "the checkpoint's options['lr_test']")
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


def check_record(record, rule, where: str) -> None:
    """Refuse a rate test's ``record`` (:meth:`RateTest.record`) that no sweep writes: other
    fields, more than :data:`MAX_TEST_STEPS` steps, step lists of another length, rates that
    are not positive and finite, ``kept`` outside ``[0, steps]``; and a record whose presence
    disagrees with ``rule`` (the options' ``lr_rule``: ``"range test"`` exactly where a record
    is). A resumed fit takes its rate and the steps left to it from the record."""
    if record is None:
        if rule == "range test":
            raise ValueError(f"{where} is missing, where lr_rule={rule!r}: {_CHANGED}")
        return
    fields = {f.name for f in dataclasses.fields(RateTest)}
    if not isinstance(record, dict) or not fields - {"kept"} <= set(record) <= fields:
        names = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where} holds {names}, not the fields {sorted(fields)}: {_CHANGED}")
    steps, kept = record["steps"], record.get("kept", 0)
    problem = None
    if rule != "range test":
        problem = f"a record where lr_rule={rule!r}"
    elif not (is_int(steps) and 1 <= steps <= MAX_TEST_STEPS):
        problem = f"steps={steps!r}, where a sweep takes 1 to {MAX_TEST_STEPS}"
    elif not all(_floats(record[k], steps) for k in ("rates", "losses", "data_losses")):
        problem = f"rates, losses or data_losses that are not {steps} numbers each"
    elif not all(_rate(v) for v in (*record["rates"], record["base"], record["lr"])):
        problem = "a rate that is not a positive finite number"
    elif not (_rate(record["lr_min"]) or record["lr_min"] == 0) or not _seconds(record):
        problem = f"lr_min={record['lr_min']!r} or seconds={record['seconds']!r}"
    elif not (is_int(kept) and 0 <= kept <= steps):
        problem = f"kept={kept!r}, outside 0 to steps={steps}"
    if problem:
        raise ValueError(f"{where} holds {problem}: {_CHANGED}")


_CHANGED = "the checkpoint was changed; start the fit again or use another checkpoint"


def _number(value) -> bool:
    """A plain number of a record (an ``int`` or ``float``, not a ``bool``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _floats(values, count: int) -> bool:
    return isinstance(values, list) and len(values) == count and all(map(_number, values))


def _rate(value) -> bool:
    return _number(value) and 0 < value < math.inf


def _seconds(record: dict) -> bool:
    return _number(record["seconds"]) and 0 <= record["seconds"] < math.inf


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
