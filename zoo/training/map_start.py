"""A variational fit from scratch started at a MAP fit made inside the same call.

Under the model's own ELBO, a family fitted from its own initialisation on a deep network and
few data goes where that ELBO's optimum is: a noisy network, whose predictions fall behind
the point estimate's, and further the longer it trains (``benchmarks/against_map.py``). The
field's answer is to start the posterior at a good mode (Rossi et al. 2018, "Good
Initializations of Variational Bayes for Deep Models"; bayesian-torch's MOPED). So a fit
that :func:`plan` accepts runs in two phases of one budget and one rate schedule:

1. **MAP**: the point-mass family (``"map"``: ``-log p(D | w) - log p(w)`` under the model's
   prior) on the same model, data, minibatches and seed, for the first :data:`MAP_SHARE` of
   the fit's steps. Its rate is measured by the range test over the whole fit's length (the
   MAP default call's test, :mod:`zoo.training.rate`) and decays as the whole fit's schedule
   does (tenfold over all its steps); the phase stops where its share ends. Batch norm's
   running statistics go on from there.
2. **The family** from the MAP weights, as from a trained network's (its means at them, its
   scales at :data:`guides.initial.TRAINED_RELATIVE_SCALE` of each site's root mean square;
   a family named without options built with its recipe's ``map_start_options``,
   :func:`after_map`), for the remaining steps, on the model's ELBO (the fit's ``loss`` group
   as given), at the rate the MAP phase left, decaying on to a tenth of the measured rate at
   the last step.

The result is the family's fit: its ``losses`` are the second phase's ``-ELBO``; its
``wall_time`` both phases'; ``options["recipe"]`` ends ``", MAP start"``;
``options["map_start"]`` records the MAP phase (``steps``, its rate and ``lr_test``, its last
loss, seconds) or, where the rule did not apply, why; ``options["num_steps"]`` is the whole
fit's. A callback runs in both phases (each counts its own steps). Ctrl-C in the MAP phase
returns the MAP fit so far (``interrupted``).

Checkpoints: the MAP phase writes beside the fit's checkpoint (:func:`phase_path`:
``fit.ckpt``'s is ``fit.map-phase.ckpt``), the family's phase to it. ``resume=path`` goes on
where the fit stopped, exactly as if it had not: in the MAP phase from its checkpoint (then the
family from the start), or in the family's phase from ``path`` (the MAP phase's record read
from its checkpoint). A checkpoint of a fit without a MAP phase (no phase file beside it)
resumes as that fit, without one.

``zoo.Loss(map_start=...)``: ``"auto"`` (the default) applies the rule to a fresh minibatch
fit of a family that can start at given weights (every family but WHVI, the point mass itself
and MC dropout, whose recipe says ``map_start=False``) on a zoo model, at the default rate and
schedule, long enough for the MAP phase to measure its rate
(:data:`zoo.training.rate.MIN_FIT_STEPS`); ``False`` fits the model's ELBO from the family's
own initialisation all the way; ``True`` applies it wherever it can run (a short fit, small
regression data's full-batch recipe), and refuses, saying why, where it cannot: a trained
start, a given rate or schedule, a convergence rule, a distributed fit, a guide instance or
factory, the resume of a fit that had no MAP phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from guides.registry import Family, family, family_class, recipe
from zoo.data.forms import batches_per_epoch, size
from zoo.models.base import BayesianModel
from zoo.training.checkpoint import read_checkpoint
from zoo.training.rate import MIN_FIT_STEPS
from zoo.training.recipes import warn_if_short
from zoo.training.start import StartWarning

__all__ = ["MAP_SHARE", "MapStart", "after_map", "phase_path", "plan", "run"]

#: The MAP phase's share of the fit's optimiser steps.
MAP_SHARE = 0.8


@dataclass(frozen=True)
class MapStart:
    """A fit of ``total`` steps whose first ``map_steps`` are the MAP phase."""

    total: int
    map_steps: int


def plan(model, guide, data, *, loss, length, lr, optim, engine, run, convergence, trained):
    """``(MapStart or None, why)``: whether a fit with these resolved settings starts with a
    MAP phase (the module docstring's rule, under ``loss.map_start``), and, where it does not,
    why (``result.options["map_start"]``). Raises ``ValueError`` where ``map_start=True``
    cannot run."""
    option = loss.map_start
    if option is False:
        return None, "off (zoo.Loss(map_start=False))"
    cannot = _cannot(model, guide, lr, optim, engine, run, convergence, trained)
    total = None if cannot else _total(data, length, engine)
    if total is None:
        cannot = cannot or "the data have no length to share the steps by"
        if option is True:
            raise ValueError(f"zoo.Loss(map_start=True) cannot run here: {cannot}")
        return None, f"not run: {cannot}"
    map_steps = int(round(MAP_SHARE * total))
    if option == "auto":
        if length.recipe.startswith("small regression data"):
            return None, "not run: small regression data's full-batch recipe"
        if map_steps < MIN_FIT_STEPS:
            return None, f"not run: a MAP phase of {map_steps} steps could not measure its rate"
    if not 1 <= map_steps < total:
        raise ValueError(f"zoo.Loss(map_start=True): a fit of {total} step(s) has no two phases")
    return MapStart(total, map_steps), "run"


def _cannot(model, guide, lr, optim, engine, run, convergence, trained) -> str | None:
    """Why no MAP phase can run (``None`` when one can)."""
    if not isinstance(model, BayesianModel):
        return "the model is not a zoo model (zoo.models, zoo.models.from_module)"
    if not isinstance(guide, (str, type, Family)):  # built already, or built by the user's code
        return "the guide is an instance or a factory (give a family name or guides.family)"
    cls = family_class(guide)
    if getattr(cls, "family", None) == "map" or not getattr(cls, "STARTS_AT_WEIGHTS", False):
        return f"the {cls.__name__} family does not start at given weights"
    if not recipe(guide).map_start:
        return f"the {cls.__name__} family fits from its own start (its recipe's map_start)"
    if trained:
        return "the fit starts at a trained network's weights"
    if lr is not None or optim.lr_schedule is not None or optim.lr_multipliers is not None:
        return "a rate, schedule or rate multipliers are given"
    if convergence is not None:
        return "a convergence rule decides the length"
    if run.resume is not None and not phase_path(run.resume).exists():
        beside = phase_path(run.resume).name
        return f"resume={str(run.resume)!r} is a fit without a MAP phase (no {beside})"
    if engine.distributed:
        return "a distributed fit"
    return None


def phase_path(path) -> Path:
    """The MAP phase's checkpoint beside the fit's ``path``: ``fit.ckpt`` -> ``fit.map-phase.ckpt``
    (``fit`` -> ``fit.map-phase``)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.map-phase{path.suffix}")


def _total(data, length, engine) -> int | None:
    """The fit's optimiser steps, as :func:`zoo.training.fitting` counts them."""
    if length.num_steps is not None:
        return int(length.num_steps)
    batches = batches_per_epoch(data, length.batch_size)
    if batches is None:
        return None
    return length.epochs * math.ceil(batches / engine.accumulate)


def run(fit, phases: MapStart, model, guide, data, *, seed, length, optim, loss, engine, run):
    """Both phases (the module docstring) through ``fit`` (``zoo.fit``): the family's
    ``FitResult``, or the MAP fit so far when it was interrupted."""
    warn_if_short(length.recipe, phases.total, size(data) or 0, length.batch_size)
    common = dict(batch_size=length.batch_size, seed=seed, engine=engine)
    family_loss = dataclasses.replace(loss, map_start=False)
    if run.resume is not None and Path(run.resume).exists():  # in the family's phase
        return _resume_family(fit, phases, model, guide, data, common, length, optim,
                              family_loss, run)  # fmt: skip

    def stop(view) -> bool:  # the rate test's steps are the MAP phase's too
        return view.step >= phases.map_steps - _tested(view.result.options)

    first = dataclasses.replace(
        run, callbacks=[*run.callbacks, stop], statistics="running",
        checkpoint=None if run.checkpoint is None else phase_path(run.checkpoint),
        resume=None if run.resume is None else phase_path(run.resume),
    )  # fmt: skip
    length_now = phases.total if first.resume is None else _left_to_run(phases, first.resume)
    point = fit(model, "map", data, num_steps=length_now, optim=optim, run=first, **common)
    if point.interrupted:
        return point
    taken, rate = len(point.losses), point.options["lr"]
    left = _map_length(phases, point.options)
    weights = {k: v.detach() for k, v in point.guide.median().items() if k in model.site_shapes}
    second = dataclasses.replace(optim, lr_schedule=_Continued(taken, left))
    built = after_map(guide)
    with _offering(model, weights), warnings.catch_warnings():
        warnings.simplefilter("ignore", StartWarning)  # the MAP phase said it
        result = fit(
            model, built, data, num_steps=max(left - taken, 1), lr=rate,
            optim=second, loss=family_loss, run=dataclasses.replace(run, resume=None), **common,
        )  # fmt: skip
    record = _record(point.options, point.losses, point.wall_time, taken, guide, built)
    return _finish(result, phases, length, optim, point.options, record)


def _resume_family(fit, phases, model, guide, data, common, length, optim, loss, run):
    """The family's phase resumed from ``run.resume``: its length and rate as the checkpoint
    says (its schedule's position comes back with the scheduler's state), the MAP phase's
    record from the phase's checkpoint beside it."""
    saved = read_checkpoint(run.resume)
    first = read_checkpoint(phase_path(run.resume))
    options, state = saved["options"], first["state"]
    if options.get("guide") == "map" or first["options"].get("guide") != "map":
        raise ValueError(
            f"resume={str(run.resume)!r}: a fit with a MAP phase writes that phase to "
            f"{phase_path(run.resume).name} and the family's to {Path(run.resume).name}; "
            "these files are not such a pair (renamed or changed)"
        )
    taken, left = len(state["losses"]), _map_length(phases, first["options"])
    second = dataclasses.replace(optim, lr_schedule=_Continued(taken, left))
    built = after_map(guide)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StartWarning)  # the MAP phase said it
        result = fit(
            model, built, data, num_steps=int(options["num_steps"]),
            lr=float(options["lr"]), optim=second, loss=loss, run=run, **common,
        )  # fmt: skip
    record = _record(first["options"], state["losses"], float(state["wall_time"]), taken,
                     guide, built)  # fmt: skip
    return _finish(result, phases, length, optim, first["options"], record)


def after_map(guide):
    """The family the second phase fits: ``guide`` itself, or, where it names a family without
    options (a name, a class, ``guides.family(name)``) whose recipe has ``map_start_options``,
    that family built with them (the tridiagonal family's ``parameterization="free"``)."""
    options = recipe(guide).map_start_options
    if not options or (isinstance(guide, Family) and guide.options):
        return guide
    return family(guide.guide if isinstance(guide, Family) else guide, **options)


def _map_length(phases: MapStart, options: dict) -> int:
    """The MAP fit's own steps: the whole fit's, less its rate test's (as the test charges
    them), over which its schedule decays."""
    return max(phases.total - _tested(options), 1)


def _left_to_run(phases: MapStart, path) -> int:
    """``num_steps`` for the MAP phase resumed from ``path``: the whole fit's, or, where the
    phase had ended (a fit stopped before the family's first checkpoint), exactly the steps it
    took, so the resume takes none (its stopping callback acts after a step)."""
    saved = read_checkpoint(path)
    tested, done = _tested(saved["options"]), len(saved["state"]["losses"])
    return done + tested if done >= phases.map_steps - tested else phases.total


def _tested(options: dict) -> int:
    """The rate test's steps in a MAP fit's ``options`` (0 without one)."""
    return int((options.get("lr_test") or {}).get("steps", 0))


def _finish(result, phases: MapStart, length, optim, map_options: dict, record: dict):
    """The family's ``result`` as the whole fit's: both phases' seconds, the fit's length,
    recipe, rate rule and start, and the MAP phase's ``record``."""
    result.wall_time += record["seconds"]
    result.options.update(
        num_steps=phases.total,
        recipe=length.recipe + ", MAP start",
        lr_rule="the MAP phase's " + str(map_options.get("lr_rule")),
        lr_schedule=optim.lr_schedule or "exponential",
        start="fresh",
        start_rule=f"MAP start (then the family: {result.options.get('start_rule')})",
        map_start=record,
    )
    return result


def _record(options: dict, losses: list, seconds: float, taken: int, guide, built) -> dict:
    """``result.options["map_start"]`` of a fit that ran its MAP phase: from that phase's
    ``options``, ``losses`` and ``seconds`` (its fit's, or its checkpoint's), and the options
    :func:`after_map` built the family with (``family_options``, ``{}`` for none)."""
    return {
        "family_options": dict(built.options) if built is not guide else {},
        "steps": taken + _tested(options),
        "lr": options["lr"],
        "lr_rule": options.get("lr_rule"),
        "lr_test": options.get("lr_test"),
        "last_loss": float(losses[-1]) if losses else None,
        "seconds": seconds,
    }


class _Continued:
    """The whole fit's tenfold decay from step ``taken`` of ``left`` on: the second phase's
    schedule (``0.1 ** ((taken + step) / left)``)."""

    def __init__(self, taken: int, left: int):
        self.taken, self.left = taken, max(left, 1)

    def __call__(self, step: int) -> float:
        return 0.1 ** ((self.taken + step) / self.left)


@contextlib.contextmanager
def _offering(model: BayesianModel, weights: dict):
    """``model`` offering ``weights`` as its guides' initial means inside the block (as a
    trained network converted with ``init="module"`` does); its network's own weights and its
    ``init`` back afterwards."""
    params = dict(model.net.named_parameters())
    saved = {name: params[name].detach().clone() for name in weights}
    init, inferred = model.init, model.inferred_init
    try:
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(model.to_parameter(name, value))
        model.init, model.inferred_init = "module", None
        yield model
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)
        model.init, model.inferred_init = init, inferred
