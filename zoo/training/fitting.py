"""``zoo.fit``: a fit of a variational posterior, built from its pieces.

``fit`` checks and resolves its arguments into one
:class:`~zoo.training.process.Settings` (defaults: :mod:`zoo.training.recipes`; option groups:
:mod:`zoo.training.options`); each process then builds the pieces and takes the steps
(:func:`zoo.training.process.fit_process`). Each piece has its own module.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, overload

from pyro.infer.autoguide import AutoGuide
from typing_extensions import Unpack

import guides as guide_registry
from zoo.arguments import check_checkpoint_path, check_length, check_positive, check_seed
from zoo.data.forms import Data
from zoo.models.base import BayesianModel
from zoo.models.checks import check_model
from zoo.models.predictions import Prediction, PredictionT
from zoo.results.loading import load
from zoo.results.variational import FitResult
from zoo.runtime import distributed
from zoo.runtime.distributed import Ranks
from zoo.runtime.serial import one_at_a_time
from zoo.training import map_start
from zoo.training import rules as step_rules
from zoo.training.convergence import Convergence
from zoo.training.convergence import resolve as resolve_convergence
from zoo.training.keywords import HowToFit, refuses_flat_keywords
from zoo.training.options import Engine, Loss, Optim, Run, group
from zoo.training.process import Settings, fit_process
from zoo.training.recipes import (
    resolve_length,
    starts_trained,
)
from zoo.training.start import record, resolve_start


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
            functools.partial(fit_process, model=model, guide=guide, data=data, settings=settings),
            accelerator=distributed.accelerator_for(engine.device, engine.accelerator),
            devices=engine.devices,
            num_nodes=engine.num_nodes,
            strategy=engine.strategy,
            rebuild=functools.partial(load, model=model),
        )
    return fit_process(Ranks(), model=model, guide=guide, data=data, settings=settings)
