"""``zoo.fit``: a fit of a variational posterior, built from its pieces.

``fit`` checks and resolves its arguments into one :class:`Settings` (defaults:
:mod:`zoo.training.recipes`; option groups: :mod:`zoo.training.options`); each process then
builds the pieces (batches, guide, the objective by :meth:`zoo.Objective.from_loss`, the
optimiser, the step plan of :mod:`zoo.training.rules`, the stepper by
:meth:`zoo.Stepper.build`, the loop state) and runs a :class:`zoo.training.loop.Trainer`
(epochs, checkpoints, Ctrl-C). Each piece has its own module; ``result.options`` is written
here only.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, overload

import torch
from pyro.infer.autoguide import AutoGuide
from typing_extensions import Unpack

import guides as guide_registry
from zoo.arguments import check_checkpoint_path, check_length, check_positive, check_seed
from zoo.data.batches import batch_order, fit_batches
from zoo.data.fingerprint import data_fingerprint
from zoo.data.forms import Data
from zoo.inference.objective import Objective
from zoo.models.base import BayesianModel
from zoo.models.checks import check_model
from zoo.models.predictions import Prediction, PredictionT
from zoo.models.statistics import frozen_statistics, training_mode
from zoo.results.loading import load
from zoo.results.variational import FitResult
from zoo.runtime import distributed
from zoo.runtime.distributed import Ranks
from zoo.runtime.rng import seeded
from zoo.runtime.serial import one_at_a_time
from zoo.runtime.threads import intra_op_threads
from zoo.storage import guide_form, model_form
from zoo.training import map_start, rate
from zoo.training import rules as step_rules
from zoo.training.checkpoint import (
    LoopState,
    check_identity,
    check_position,
    fit_identity,
    read_checkpoint,
    restore,
    restore_rank_generator,
)
from zoo.training.convergence import Convergence, ConvergenceTracker
from zoo.training.convergence import resolve as resolve_convergence
from zoo.training.keywords import HowToFit, refuses_flat_keywords
from zoo.training.loop import Trainer
from zoo.training.optim import (
    check_finite_parameters,
    make_scheduler,
    named_parameters,
    optimizer_at,
)
from zoo.training.options import Engine, Loss, Optim, Run, group
from zoo.training.recipes import (
    Length,
    resolve_device,
    resolve_length,
    starts_trained,
    warn_if_short,
)
from zoo.training.refresh import hold_inputs, refresh_statistics
from zoo.training.start import Start, record, resolve_start, warn_inferred
from zoo.training.step import Stepper


# What a fit predicts, for a type checker: a zoo model's prediction type, else the base.
@overload
def fit(
    model: BayesianModel[PredictionT],
    guide: str | type | Callable | AutoGuide,
    data: Data,
    **how: Unpack[HowToFit],
) -> FitResult[PredictionT]: ...
@overload
def fit(
    model: Callable,
    guide: str | type | Callable | AutoGuide,
    data: Data,
    **how: Unpack[HowToFit],
) -> FitResult[Prediction]: ...


@refuses_flat_keywords
@one_at_a_time
def fit(
    model: Callable,
    guide: str | type | Callable | AutoGuide,
    data: Data,
    *,
    epochs: int | None = None,
    num_steps: int | str | Convergence | None = None,
    batch_size: int | None = None,
    lr: float | str | None = None,
    seed: int | None = 0,
    optim: Optim | Mapping | None = None,
    loss: Loss | Mapping | None = None,
    engine: Engine | Mapping | None = None,
    run: Run | Mapping | None = None,
) -> FitResult[Any]:
    """Fit a variational posterior to a Pyro model by stochastic variational inference.

    Each step draws a minibatch, estimates the full-data ELBO with Pyro's ``Trace_ELBO``
    (or ``TraceMeanField_ELBO``), and takes one step of a torch optimiser on ``-ELBO``.
    Minibatches are unbiased for the full-data ELBO: sites in ``pyro.plate("data", B)`` are
    scaled by ``N / B`` (see :mod:`zoo.inference.elbo`).

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y=None)`` that observes ``y`` in ``pyro.plate("data", len(x))``,
        e.g. any ``zoo.models`` network.
    guide : str, AutoGuide subclass, callable or AutoGuide
        A registered family name (``guides.available()``: ``"diagonal"``, ``"lowrank"``,
        ``"tridiagonal"``, ``"matrix_normal"``, ...), a family with options
        (``guides.family("lowrank", rank=5)``), a guide class, a callable ``model -> guide``,
        or a guide instance.
    data : (X, y), Dataset or DataLoader
        Training data; ``N = len(data)``.
    epochs : int, optional
        Passes over the data (ignored when ``num_steps`` is given).
    num_steps : int, "auto" or zoo.Convergence, optional
        Total optimiser steps, cycling over the data as needed; ``"auto"`` (or a
        :class:`zoo.Convergence` with its own settings) cuts the rate tenfold when the mean
        ``-ELBO`` of a window of steps stops improving on the previous window's, and stops at
        the next such plateau, at most at the cap (:mod:`zoo.training.convergence`;
        ``result.options["stopped"]`` says why a fit ended). With neither ``epochs`` nor
        ``num_steps``: small regression data (at most :data:`zoo.training.recipes.SMALL_DATA` =
        2,048 examples) gets the full-batch recipe :data:`zoo.REGRESSION_FIT` (every example in one
        batch, 3,000 steps, ``lr`` 1e-2 decaying tenfold, each unless given); anything larger
        one epoch, with a warning when that is under 200 steps (:mod:`zoo.training.recipes`).
        ``result.options["recipe"]`` says which applied.
    batch_size : int, optional
        Minibatch size (a DataLoader keeps its own); default 128, or all of small data.
    lr : float or "auto", optional
        Learning rate. Default: measured by a learning-rate range test at the start of the
        fit, its steps charged to the fit (:mod:`zoo.training.rate`), then decaying tenfold;
        fixed where the fit is too short to measure (under 64 steps: 3e-3 decaying tenfold),
        for small regression data (1e-2 decaying), from a trained network's weights (a
        thirtieth of those) and under ``num_steps="auto"`` (a constant 1e-3), each times the
        family's scale (:func:`guides.recipe`). ``"auto"``: measured, or refused where the fit
        is too short. A given rate is constant unless ``zoo.Optim(lr_schedule=...)`` is given
        too. ``result.options["lr_rule"]`` says which applied, ``["lr_test"]`` the test.
    seed : int or None, default 0
        Seeds the weight draws and the shuffling, in a generator state of the fit's own: the
        caller's global random state is the same after the fit as before. ``None`` draws
        from the global generators as they are (and advances them).
    optim : zoo.Optim or dict, optional
        The optimiser, its schedule and options, gradient clipping, ``per_example`` scaling.
    loss : zoo.Loss or dict, optional
        The ELBO (``"trace"`` or ``"meanfield"``), the estimator, particles, KL weight, and
        whether a fit from scratch starts with a MAP phase (``map_start``; by default where
        :mod:`zoo.training.map_start` says: ``result.options["map_start"]``).
    engine : zoo.Engine or dict, optional
        The device, threads, compiled loss, the host's read cadence, the CUDA graph, gradient
        accumulation, and the processes of a distributed fit (:mod:`zoo.training.rules` says which
        combine; refusals come before training).
    run : zoo.Run or dict, optional
        The progress bar, callbacks, the divergence policy, checkpoints and resume.

    Returns
    -------
    FitResult
        ``result.options`` records what ran: the resolved length and recipe, the step plan
        (``jit``, ``threads``, ``check_every``, ``cuda_graph``, ``accumulate``) and how the
        fit ended (``stopped``, ``stopped_at``).

    Notes
    -----
    Every group's fields and defaults are documented once, in :mod:`zoo.training.options`; a
    field passed as a keyword of its own (``progress=``) is refused, naming its group.
    """
    optim, loss = group(Optim, optim), group(Loss, loss)
    engine, run = group(Engine, engine), group(Run, run)
    # The checks of the arguments alone, here: before any process is started.
    check_model(model, guide)
    check_seed(seed)
    check_length(epochs, num_steps)
    check_checkpoint_path(run.checkpoint)
    step_rules.check_options(engine, engine.distributed)
    num_steps, convergence = resolve_convergence(num_steps)
    given = dict(epochs=epochs, num_steps=num_steps, batch_size=batch_size)
    check_positive(**given, lr=None if lr == "auto" else lr)
    auto = convergence is not None
    start = resolve_start(model, data)  # trained or fresh: before the rate is chosen
    trained = starts_trained(model, guide)
    length = resolve_length(
        data,
        model,
        epochs=epochs,
        num_steps=num_steps,
        batch_size=batch_size,
        lr=lr,
        lr_schedule=optim.lr_schedule,
        auto=auto,
        recipe=guide_registry.recipe(guide),  # the family's (guides.registry.Recipe)
        trained=trained,
    )
    phases, why = map_start.plan(
        model, guide, data, loss=loss, length=length, lr=lr, optim=optim, engine=engine,
        run=run, convergence=convergence, trained=trained,
    )  # fmt: skip
    if phases is not None:  # a MAP phase, then the family from its weights
        return map_start.run(
            fit, phases, model, guide, data, seed=seed, length=length, optim=optim, loss=loss,
            engine=engine, run=run,
        )  # fmt: skip
    optim = dataclasses.replace(optim, lr_schedule=length.lr_schedule)
    loss = loss.resolved(guide_registry.recipe(guide))  # the family's ELBO and estimator
    started = {**record(start, trained), "map_start": why}
    settings = Settings(length, seed, optim, loss, engine, run, convergence, started, start)
    if engine.distributed:
        return distributed.launch(
            functools.partial(_fit, model=model, guide=guide, data=data, settings=settings),
            accelerator=distributed.accelerator_for(engine.device, engine.accelerator),
            devices=engine.devices,
            num_nodes=engine.num_nodes,
            strategy=engine.strategy,
            rebuild=functools.partial(load, model=model),
        )
    return _fit(Ranks(), model=model, guide=guide, data=data, settings=settings)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What :func:`fit` checked and resolved, as every process of the fit receives it."""

    length: Length
    seed: int | None
    optim: Optim
    loss: Loss
    engine: Engine
    run: Run
    convergence: Convergence | None
    #: ``result.options``' ``start``, ``start_rule`` (:func:`zoo.training.start.record`)
    #: and ``map_start`` (:func:`zoo.training.map_start.plan`'s why)
    start: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The model's start, warned of once the data pass their checks (an inferred one)
    inferred: Start | None = None


def _fit(ranks: Ranks, *, model, guide, data, settings: Settings) -> FitResult:
    """``fit`` in this process, which is rank ``ranks.rank`` of ``ranks.world_size``."""
    s = settings
    if ranks.distributed and ranks.device is not None:  # the launcher's device for this rank
        dev = ranks.device
    else:
        dev = resolve_device(s.engine.device)
    if isinstance(model, torch.nn.Module):
        model.to(dev)
        if getattr(model, "statistics_inputs", None) is not None:  # a former fit's: this one
            setattr(model, "statistics_inputs", None)  # noqa: B010 - holds its own
    seed = s.seed
    if ranks.distributed and seed is None:  # one seed for the shared shuffle and guide
        seed = ranks.gather(int(torch.randint(2**31, ())))[0]
    with seeded(seed, dev), training_mode(model):
        batches, generator = fit_batches(model, data, s.length.batch_size, dev, seed, ranks)
        if ranks.rank == 0:
            warn_inferred(s.inferred)
        guide = guide_registry.instantiate(guide, model, {})
        # What a checkpoint records and a resume must match; the data's fingerprint is kept in
        # result.options too (a saved fit says what it was fitted to).
        identity = fit_identity(
            data_fingerprint(data), batches.batch_size, s.length, s.optim, s.loss, s.engine,
            seed=s.seed, order=batch_order(data), model_print=model_form.model_fingerprint(model),
        )  # fmt: skip
        resumed = read_checkpoint(s.run.resume, guide) if s.run.resume else None
        if resumed is not None:
            check_identity(
                s.run.resume, resumed.get("identity"), identity, resumed.get("version", 2)
            )
            guide = guide_form.build_guide(model, resumed["guide"])
        guide.to(dev)
        objective = Objective.from_loss(model, guide, s.loss, jit=s.engine.jit)
        with frozen_statistics():  # the guide's set-up traces the model: not a training step
            objective.setup(*batches.first(), batch_size=batches.minibatch_size)
        if s.run.statistics == "per_draw":  # mid-fit predictions normalise each draw as after
            hold_inputs(model, batches)
        if s.run.checkpoint is not None:
            guide_form.guide_payload(guide)  # a guide that cannot be saved fails now, not later
        opt, plan, total = _optimiser(objective, batches, s, dev, ranks)
        check_finite_parameters(guide, model)
        if ranks.distributed:  # the same start everywhere, then each rank's own draws
            assert seed is not None  # drawn above for every distributed run
            ranks.broadcast_(p for _, p in named_parameters(guide, model))
            _seed_rank(ranks.seed(seed), dev)
        measured = rate.measure(objective, batches, opt, plan, s, total, resumed, generator, ranks)
        if measured is not None:
            s = dataclasses.replace(s, length=measured.length)
            total = measured.total
        tracker = ConvergenceTracker(s.convergence, len(batches)) if s.convergence else None
        sched = make_scheduler(opt, s.optim.lr_schedule, total, tracker)  # over its steps
        result: FitResult[Any] = FitResult(model=model, guide=guide, device=dev)
        result.options = _options(guide, total, batches, s, objective, plan, seed, ranks)
        result.options["data"] = identity["data"]
        result.options.update(s.start)  # where it started and why (zoo.training.start)
        if measured is not None:
            result.options["lr_test"] = measured.record
        if resumed is not None:
            state = restore(resumed, model, opt, sched, generator, s.run.resume)
            check_position(s.run.resume, state, plan.steps_per_epoch(batches.steps_per_epoch))
            if ranks.distributed and not restore_rank_generator(resumed, ranks):
                assert seed is not None
                _seed_rank(ranks.seed(seed + state.step), dev)  # another layout: fresh draws
        else:  # the rate test's seconds are the fit's (its steps are, too)
            spent = measured.record["seconds"] if measured is not None else 0.0
            state = LoopState(epoch_start_state=generator.get_state(), wall_time=spent)
        stepper = Stepper.build(
            objective,
            opt,
            num_data=len(batches),
            on_divergence=s.run.on_divergence,
            state=state,
            plan=plan,
            scheduler=sched,
            clip_grad_norm=s.optim.clip_grad_norm,
            per_example=s.optim.per_example,
            ranks=ranks,
        )
        trainer = Trainer(
            stepper=stepper,
            batches=batches,
            generator=generator,
            result=result,
            checkpoint=s.run.checkpoint,
            checkpoint_every=s.run.checkpoint_every,
            identity=identity,
            ranks=ranks,
            convergence=tracker,
        )
        try:
            with intra_op_threads(plan.threads):
                trainer.run(total, list(s.run.callbacks), s.run.progress)
                if s.run.statistics != "running" and not result.interrupted:
                    start = time.perf_counter()
                    keep = s.run.statistics == "per_draw"
                    if refresh_statistics(objective, batches, ranks, keep=keep):
                        result.options["statistics"] = s.run.statistics
                    result.wall_time += time.perf_counter() - start
        finally:
            graph = stepper.graph.state if stepper.graph is not None else plan.graph_record
            result.options.update(jit=objective.jit_state, cuda_graph=graph, **trainer.outcome())
        return result


def _optimiser(objective, batches, s: Settings, dev, ranks: Ranks):
    """The fit's optimiser, its step plan (:func:`zoo.training.rules.plan` on the fit's
    ``zoo.Engine``) and the fit's length in optimiser steps."""
    length = s.length
    opt = optimizer_at(length.lr, objective, s.optim)
    plan = step_rules.plan(s.engine, objective, opt, dev, ranks.distributed)
    per_epoch = plan.steps_per_epoch(batches.steps_per_epoch)
    total = length.num_steps if length.num_steps is not None else length.epochs * per_epoch
    if s.run.resume is None and ranks.rank == 0:
        warn_if_short(length.recipe, total, len(batches), batches.batch_size)
    return opt, plan, total


def _seed_rank(rank_seed: int, dev) -> None:
    torch.manual_seed(rank_seed)
    if dev is not None and dev.type == "cuda":
        torch.cuda.manual_seed(rank_seed)


def _options(guide, total, batches, s: Settings, objective, plan, seed, ranks) -> dict:
    """What a fit records in ``result.options`` before its first step (how it ended is added
    after its last, from :meth:`zoo.training.loop.Trainer.outcome`)."""
    length, optim, loss = s.length, s.optim, s.loss
    return dict(
        guide=getattr(guide, "family", None) or type(guide).__name__,
        epochs=length.epochs,
        num_steps=total,
        recipe=length.recipe,
        batch_size=batches.batch_size,
        lr=length.lr,
        lr_rule=length.lr_rule,
        lr_schedule=length.lr_schedule if not callable(length.lr_schedule) else "schedule",
        num_particles=loss.num_particles,
        kl_weight=loss.kl_weight if not callable(loss.kl_weight) else "schedule",
        per_example=optim.per_example,
        elbo=objective.elbo,  # what ran: a family's own may depend on the layers served
        estimator=loss.estimator,
        estimator_sites=sorted(objective.served),
        seed=seed,
        threads=plan.threads or torch.get_num_threads(),
        world_size=ranks.world_size,
        check_every=plan.check_every,
        cuda_graph=plan.graph_record,
        accumulate=plan.accumulate,
    )
