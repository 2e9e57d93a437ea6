"""One process's ``zoo.fit``, built from its pieces: the batches, the guide (rebuilt from a
checkpoint it resumes), the objective by :meth:`zoo.Objective.from_loss`, the optimiser, the step
plan of :mod:`zoo.training.rules`, the rate test, the stepper by :meth:`zoo.Stepper.build`, the
loop state, and a :class:`zoo.training.loop.Trainer` that takes the steps (epochs, checkpoints,
Ctrl-C). :func:`zoo.fit` (:mod:`zoo.training.fitting`) checks and resolves the arguments into
one :class:`Settings` and runs :func:`fit_process` in this process or in each of a distributed
fit's; ``result.options`` is written here only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch

import guides as guide_registry
from zoo.data.batches import batch_order, fit_batches
from zoo.data.fingerprint import data_fingerprint
from zoo.inference.objective import Objective
from zoo.models.statistics import frozen_statistics, training_mode
from zoo.results.variational import FitResult
from zoo.runtime.distributed import Ranks
from zoo.runtime.rng import seeded
from zoo.runtime.threads import intra_op_threads
from zoo.storage import guide_form, model_form
from zoo.training import rate
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
from zoo.training.loop import Trainer
from zoo.training.optim import (
    check_finite_parameters,
    make_scheduler,
    named_parameters,
    optimizer_at,
)
from zoo.training.options import Engine, Loss, Optim, Run
from zoo.training.recipes import (
    Length,
    resolve_device,
    warn_if_short,
)
from zoo.training.refresh import hold_inputs, refresh_statistics
from zoo.training.start import Start, warn_inferred
from zoo.training.step import Stepper


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


def fit_process(ranks: Ranks, *, model, guide, data, settings: Settings) -> FitResult:
    """``zoo.fit`` in this process, which is rank ``ranks.rank`` of ``ranks.world_size``: the
    pieces built (:func:`_built`), the optimiser, the rate test and the result's record, then
    the steps (:func:`_trained`)."""
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
        guide, identity, resumed, objective = _built(model, guide, data, batches, s, dev)
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
        return _trained(objective, opt, sched, plan, total, batches, generator, result, state,
                        identity, tracker, s, ranks)  # fmt: skip


def _built(model, guide, data, batches, s: Settings, dev):
    """The fit's guide (rebuilt from a checkpoint it resumes), what a checkpoint records of
    the fit (``identity``), the checkpoint read (``None`` without a resume) and the objective,
    set up on the first minibatch."""
    guide = guide_registry.instantiate(guide, model, {})
    # What a checkpoint records and a resume must match; the data's fingerprint is kept in
    # result.options too (a saved fit says what it was fitted to).
    identity = fit_identity(
        data_fingerprint(data), batches.batch_size, s.length, s.optim, s.loss, s.engine,
        seed=s.seed, order=batch_order(data), model_print=model_form.model_fingerprint(model),
    )  # fmt: skip
    resumed = read_checkpoint(s.run.resume, guide) if s.run.resume else None
    if resumed is not None:
        check_identity(s.run.resume, resumed.get("identity"), identity, resumed.get("version", 2))
        guide = guide_form.build_guide(model, resumed["guide"])
    guide.to(dev)
    objective = Objective.from_loss(model, guide, s.loss, jit=s.engine.jit)
    with frozen_statistics():  # the guide's set-up traces the model: not a training step
        x, y = batches.first()
        objective.setup(x, y, batch_size=batches.minibatch_size)
    if s.run.statistics == "per_draw":  # mid-fit predictions normalise each draw as after
        hold_inputs(model, batches)
    if s.run.checkpoint is not None:
        guide_form.guide_payload(guide)  # a guide that cannot be saved fails now, not later
    return guide, identity, resumed, objective


def _trained(objective, opt, sched, plan, total: int, batches, generator, result, state,
             identity, tracker, s: Settings, ranks: Ranks) -> FitResult:  # fmt: skip
    """The fit's steps through a :class:`zoo.training.loop.Trainer`, batch norm's statistics
    after them (``zoo.Run(statistics=...)``), and how the fit ended in ``result.options``."""
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
