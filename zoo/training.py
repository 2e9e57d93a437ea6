"""``zoo.fit``: the training loop around :class:`zoo.objective.Objective`.

``fit`` reads its arguments (defaults: :mod:`zoo.recipes`), builds the pieces (batches, guide,
objective, optimiser, divergence guard, state) and runs a :class:`zoo.trainer.Trainer` (steps,
checkpoints, Ctrl-C); each piece has its own module.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping

import torch
from pyro.infer.autoguide import AutoGuide

import guides as guide_registry
from zoo import distributed, persist
from zoo.batches import fit_batches
from zoo.convergence import Convergence, ConvergenceTracker
from zoo.convergence import resolve as resolve_convergence
from zoo.distributed import Ranks
from zoo.graphed import check_step_options, step_parts
from zoo.objective import Objective
from zoo.optim import (
    check_finite_parameters,
    check_optimizer,
    make_optimizer,
    make_scheduler,
    named_parameters,
    param_groups,
)
from zoo.recipes import check_positive, resolve_device, resolve_length, warn_if_short
from zoo.result import FitResult, FitState, load
from zoo.rng import seeded
from zoo.state import TrainingState, read_checkpoint, restore, restore_rank_generator
from zoo.threads import check_threads, intra_op_threads, step_threads
from zoo.trainer import Trainer


def fit(
    model: Callable,
    guide: str | type | Callable | AutoGuide,
    data,
    *,
    epochs: int | None = None,
    num_steps: int | str | Convergence | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    optimizer: str | type = "adam",
    optimizer_options: Mapping | None = None,
    lr_schedule: Callable[[int], float] | str | None = None,
    lr_multipliers: Mapping[str, float] | None = None,
    num_particles: int = 1,
    kl_weight: float | Callable[[int], float] = 1.0,
    elbo: str = "trace",
    guide_options: Mapping | None = None,
    device: str | torch.device = "auto",
    seed: int | None = 0,
    progress: bool = True,
    callbacks: Iterable[Callable[[FitState], bool | None]] = (),
    on_divergence: str = "raise",
    clip_grad_norm: float | None = None,
    per_example: bool = False,
    estimator: str = "reparam",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike | None = None,
    threads: int | str | None = "auto",
    jit: bool | str = "auto",
    check_every: int | str = "auto",
    cuda_graph: bool = False,
    accelerator: str = "auto",
    devices: int | str = 1,
    num_nodes: int = 1,
    strategy: str = "auto",
) -> FitResult:
    """Fit a variational posterior to a Pyro model by stochastic variational inference.

    Each step draws a minibatch, estimates the full-data ELBO with Pyro's ``Trace_ELBO``
    (or ``TraceMeanField_ELBO``), and takes one step of a torch optimiser on ``-ELBO``.
    Minibatches are unbiased for the full-data ELBO: sites in ``pyro.plate("data", B)`` are
    scaled by ``N / B`` (see :mod:`zoo.elbo`).

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y=None)`` that observes ``y`` in ``pyro.plate("data", len(x))``,
        e.g. any ``zoo.models`` network.
    guide : str, AutoGuide subclass, callable or AutoGuide
        A registered family name (``guides.available()``: ``"diagonal"``, ``"lowrank"``,
        ``"tridiagonal"``, ``"matrix_normal"``, ...), a guide class (built as
        ``cls(model, **guide_options)``), a callable ``model -> guide``, or a guide instance.
    data : (X, y), Dataset or DataLoader
        Training data; ``N = len(data)``.
    epochs : int, optional
        Passes over the data (ignored when ``num_steps`` is given).
    num_steps : int, "auto" or zoo.Convergence, optional
        Total optimiser steps, cycling over the data as needed; ``"auto"`` (or a
        :class:`zoo.Convergence` with its own settings) cuts the rate tenfold when the mean
        ``-ELBO`` of a window of steps stops improving on the previous window's, and stops at
        the next such plateau, at most at the cap (:mod:`zoo.convergence`;
        ``result.options["stopped"]`` says why a fit ended). With neither ``epochs`` nor
        ``num_steps``: small regression data (at most :data:`zoo.recipes.SMALL_DATA` = 2,048
        examples) gets the full-batch recipe :data:`zoo.REGRESSION_FIT` (every example in one batch,
        3,000 steps, ``lr`` 1e-2 decaying tenfold, each unless given); anything larger one
        epoch, with a warning when that is under 200 steps (:mod:`zoo.recipes`).
        ``result.options["recipe"]`` says which applied.
    batch_size : int, optional
        Minibatch size (a DataLoader keeps its own); default 128, or all of small data.
    lr : float, optional
        Learning rate; default 1e-3, or 1e-2 with the small-data recipe.
    optimizer : {"adam", "adamw", "sgd"} or torch optimizer class
    optimizer_options : mapping, optional
        Extra optimizer arguments, e.g. ``{"momentum": 0.9}``.
    lr_schedule : callable or {"exponential", "cosine"}, optional
        ``step -> factor`` multiplying ``lr`` (a ``LambdaLR``), e.g. Posch & Pilz's
        ``lambda i: (1 + 1e-4 * i) ** -0.75``; or a named schedule over the run's steps:
        ``"exponential"`` decays tenfold, ``"cosine"`` to a hundredth
        (:data:`zoo.optim.SCHEDULES`).
    lr_multipliers : mapping, optional
        ``fnmatch`` pattern over guide parameter names -> learning-rate factor, e.g.
        ``{"*.gamma*": 50.0}`` for the correlation parameters of the tridiagonal family
        (names look like ``sites.fc1.weight.gamma_unconstrained``).
    num_particles : int, default 1
        ELBO samples per step, vectorised into one batched pass.
    kl_weight : float or callable, default 1.0
        Factor on the prior-minus-guide (KL) part of the ELBO, or ``step -> factor`` for
        annealing. ``1`` is the true ELBO.
    elbo : {"trace", "meanfield"}
        ``Trace_ELBO`` (Monte Carlo KL) or ``TraceMeanField_ELBO`` (closed-form KL where one is
        registered, which holds for every family here against Normal priors).
    guide_options : mapping, optional
        Passed to the guide class when ``guide`` is a name or a class.
    device : "auto", "cpu", "cuda" or torch.device
        ``"auto"`` uses CUDA when available. Model, data and guide all move there.
    seed : int or None, default 0
        Seeds the weight draws and the shuffling, in a generator state of the fit's own: the
        caller's global random state is the same after the fit as before. ``None`` draws
        from the global generators as they are (and advances them).
    progress : bool, default True
        Show a tqdm progress bar.
    callbacks : iterable of callables
        Called as ``cb(FitState)`` after every step; a truthy return stops the fit.
    on_divergence : {"raise", "skip"}
        On a NaN/inf loss or gradient the guide goes back to parameters whose loss and
        gradients were finite (the message names the step), then: raise
        :class:`FitDivergedError`, or skip the step and go on (a warning counts the skipped
        steps; ``MAX_CONSECUTIVE_SKIPS`` in a row raise); see :mod:`zoo.divergence`.
    clip_grad_norm : float, optional
        Clip the global gradient norm to this value.
    per_example : bool, default False
        Optimise ``-ELBO / N`` instead of ``-ELBO`` (the same optimum; gradients N times
        smaller). Use it with SGD learning rates quoted for per-example losses, as in most
        papers; Adam is insensitive to the scale. Reported losses stay ``-ELBO``.
    estimator : {"reparam", "local", "flipout"}
        How layers see the weight posterior (see :mod:`zoo.estimators`): one shared weight draw
        per step; local reparameterisation (pre-activations sampled per example: diagonal and
        matrix-normal linear layers); or Flipout (sign-decorrelated draws per example: diagonal
        linear and convolution layers). Sites out of reach keep ``"reparam"``; the served sites
        are listed in ``result.options["estimator_sites"]``. Needs ``num_particles=1``.
    checkpoint : path, optional
        Write a checkpoint (plain data, :mod:`zoo.state`) here, atomically, every
        ``checkpoint_every`` steps (default: every epoch's end), at the end, and on Ctrl-C.
    checkpoint_every : int, optional
        Steps between checkpoints.
    resume : path, optional
        Continue from a checkpoint written by a fit with the same arguments (the same family:
        another is refused). With in-memory data
        on the CPU the resumed fit ends with the same parameters as an uninterrupted one.
        Ctrl-C during a fit returns the partial result (``result.interrupted`` is True).
    threads : "auto", int or None, default "auto"
        Torch's intra-op CPU threads during the fit, the caller's setting restored afterwards.
        ``"auto"``: one thread when the network's forward pass on a minibatch is small (under
        :data:`zoo.threads.SMALL_FORWARD_FLOPS` floating-point operations), where threads only
        add waiting, most of all on a CPU shared with other processes; torch's setting
        otherwise, and always on CUDA (:mod:`zoo.threads`). An int: that many threads. ``None``:
        torch's setting as it is. The count used is ``result.options["threads"]``.
    jit : "auto", bool, default "auto"
        Evaluate the loss through a graph traced once per minibatch shape with
        ``torch.jit.trace`` (:mod:`zoo.compiled`): the same loss and gradients for the same
        draws, without the per-step Python of Pyro's traces. ``"auto"`` compiles ``zoo`` models
        with a ``guides`` family and ``num_particles=1`` whose forward pass on the CPU is under
        :data:`zoo.compiled.COMPILE_BELOW_FLOPS` (on CUDA at any size), and falls back to the
        eager loss (with a warning) if a graph fails its check against it; ``True`` compiles
        any size and raises instead; ``False`` never compiles. The first step and the check of
        the last update are always eager (a one-step fit traces nothing); tracing the graph
        costs some tens of steps of a small net (``benchmarks/startup.py``), so for a short fit
        of one, ``jit=False`` is faster. ``result.options["jit"]`` says which ran.
    check_every : "auto" or int, default "auto"
        Steps between the host's reads of the loss (each read waits for the device). With
        ``k > 1`` the divergence test runs on the device, the fused optimiser skips a
        non-finite update there, and the host reads ``k`` steps at once, also at epoch ends,
        checkpoints and the end, and every step for ``callbacks`` (:mod:`zoo.deferred`).
        ``"auto"``: 1 on the CPU and across ranks, else :data:`zoo.deferred.CUDA_CHECK_EVERY`.
    cuda_graph : bool, default False
        Capture the whole step (loss, gradients, norm, update) as a CUDA graph and replay it
        (:mod:`zoo.graphed`). Needs CUDA, the compiled loss (``jit``), one process and "adam",
        "adamw" or "sgd"; refused before training otherwise.

    accelerator, devices, num_nodes, strategy
        Fit across processes on Lightning Fabric (names and values as Lightning's: e.g.
        ``devices=4, num_nodes=2, strategy="ddp", accelerator="gpu"``); the defaults run in this
        process on ``device``. Under ``torchrun`` or SLURM pass the same numbers the job was
        started with; otherwise Lightning starts the other processes (``"ddp"`` runs this
        script again for each, as ``torchrun`` would). Each rank draws its own minibatches (its
        shard of every epoch's shuffle) and weights (seeded from ``seed`` and its rank); the
        ranks' gradients are averaged, an unbiased estimate of the full-data ELBO's (see
        :mod:`zoo.distributed`). Rank 0 shows the progress bar and writes the checkpoints;
        every rank returns the same fitted guide. Needs ``lightning`` (the ``distributed``
        extra).

    Returns
    -------
    FitResult
    """
    settings = {k: v for k, v in locals().items() if k not in DISTRIBUTION}
    # The checks of the arguments alone, here: before any process is started.
    check_positive(num_particles=num_particles)
    check_threads(threads)
    check_step_options(check_every, cuda_graph, distributed.requested(devices, num_nodes, strategy))
    num_steps, convergence = resolve_convergence(num_steps)
    given = dict(epochs=epochs, num_steps=num_steps, batch_size=batch_size, lr=lr)
    check_positive(**given, checkpoint_every=checkpoint_every)
    auto = convergence is not None
    length = resolve_length(data, model, **given, lr_schedule=lr_schedule, auto=auto)
    settings.update(
        epochs=length.epochs,
        num_steps=length.num_steps,
        batch_size=length.batch_size,
        lr=length.lr,
        lr_schedule=length.lr_schedule,
        recipe=length.recipe,
        convergence=convergence,
    )
    settings["optimizer"] = check_optimizer(optimizer)  # the class
    if distributed.requested(devices, num_nodes, strategy):
        return distributed.launch(
            functools.partial(_fit_with, settings),
            accelerator=distributed.accelerator_for(device, accelerator),
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            rebuild=functools.partial(load, model=model),
        )
    return _fit(Ranks(), **settings)


#: ``fit``'s arguments that choose the processes, not the fit.
DISTRIBUTION = ("accelerator", "devices", "num_nodes", "strategy")


def _fit_with(settings: dict, ranks: Ranks) -> FitResult:
    return _fit(ranks, **settings)


def _fit(
    ranks: Ranks,
    model,
    guide,
    data,
    *,
    epochs,
    num_steps,
    batch_size,
    lr,
    optimizer,
    optimizer_options,
    lr_schedule,
    lr_multipliers,
    num_particles,
    kl_weight,
    elbo,
    guide_options,
    device,
    seed,
    progress,
    callbacks,
    on_divergence,
    clip_grad_norm,
    per_example,
    estimator,
    checkpoint,
    checkpoint_every,
    resume,
    threads,
    jit,
    check_every,
    cuda_graph,
    recipe="given",
    convergence=None,
) -> FitResult:
    """``fit`` in this process, which is rank ``ranks.rank`` of ``ranks.world_size``, on
    arguments ``fit`` has checked (``optimizer`` is the optimiser class)."""
    dev = ranks.device if ranks.distributed else resolve_device(device)
    if isinstance(model, torch.nn.Module):
        model.to(dev)
    if ranks.distributed and seed is None:  # one seed for the shared shuffle and guide
        seed = ranks.gather(int(torch.randint(2**31, ())))[0]
    with seeded(seed, dev):
        batches, generator = fit_batches(model, data, batch_size, dev, seed, ranks)
        x0, y0 = batches.first()

        resumed = read_checkpoint(resume, guide) if resume else None
        if resumed is not None:
            guide = persist.build_guide(model, resumed["guide"])
        else:
            guide = guide_registry.instantiate(guide, model, dict(guide_options or {}))
        guide.to(dev)
        objective = Objective(
            model,
            guide,
            elbo=elbo,
            estimator=estimator,
            num_particles=num_particles,
            kl_weight=kl_weight,
            jit=jit,
        )
        objective.setup(x0, y0)
        if checkpoint is not None:
            persist.guide_payload(guide)  # a guide that cannot be saved fails now, not later
        groups = param_groups(guide, model, lr, lr_multipliers)
        opt = make_optimizer(optimizer, groups, lr, optimizer_options or {})
        total = num_steps if num_steps is not None else epochs * batches.steps_per_epoch
        if resume is None and ranks.rank == 0:
            warn_if_short(recipe, total, len(batches), batches.batch_size)
        tracker = convergence and ConvergenceTracker(convergence, len(batches))
        sched = make_scheduler(opt, lr_schedule, total, tracker)
        check_finite_parameters(guide, model)
        if ranks.distributed:  # the same start everywhere, then each rank's own draws
            ranks.broadcast_(p for _, p in named_parameters(guide, model))
            rank_seed = ranks.seed(seed)
            torch.manual_seed(rank_seed)
            if dev.type == "cuda":
                torch.cuda.manual_seed(rank_seed)
        num_threads = step_threads(threads, dev, objective.forward_flops)

        options = dict(
            guide=getattr(guide, "family", None) or type(guide).__name__,
            epochs=epochs,
            num_steps=total,
            recipe=recipe,
            batch_size=batches.batch_size,
            lr=lr,
            num_particles=num_particles,
            kl_weight=kl_weight if not callable(kl_weight) else "schedule",
            per_example=per_example,
            elbo=elbo,
            estimator=estimator,
            estimator_sites=sorted(objective.served),
            seed=seed,
            threads=num_threads or torch.get_num_threads(),
            world_size=ranks.world_size,
        )
        result = FitResult(model=model, guide=guide, device=dev, options=options)
        if resumed is not None:
            state = restore(resumed, model, opt, sched, generator)
            if ranks.distributed and not restore_rank_generator(resumed, ranks):
                torch.manual_seed(ranks.seed(seed + state.step))  # other layout: fresh draws
        else:
            state = TrainingState(epoch_start_state=generator.get_state())
        params = [p for g in groups for p in g["params"]]
        graphed, guard = step_parts(
            objective,
            opt,
            params,
            result,
            on_divergence=on_divergence,
            check_every=check_every,
            cuda_graph=cuda_graph,
            distributed=ranks.distributed,
            num_data=len(batches),
            clip_grad_norm=clip_grad_norm,
            per_example=per_example,
        )
        trainer = Trainer(
            objective=objective,
            optimizer=opt,
            scheduler=sched,
            params=params,
            guard=guard,
            batches=batches,
            generator=generator,
            state=state,
            result=result,
            clip_grad_norm=clip_grad_norm,
            per_example=per_example,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            ranks=ranks,
            graphed=graphed,
            convergence=tracker,
        )
        try:
            with intra_op_threads(num_threads):
                trainer.run(total, list(callbacks), progress)
        finally:
            result.options["jit"] = objective.jit_state
        return result
