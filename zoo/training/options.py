"""The option groups of a fit, declared once and shared by ``zoo.fit``, ``BayesianModule`` and
the command line.

``zoo.fit(model, guide, data, epochs=, num_steps=, batch_size=, lr=, seed=)`` is a whole fit;
everything else comes in four small groups, each a frozen dataclass whose defaults are
``zoo.fit``'s (a plain ``dict`` of the same fields is accepted too):

- :class:`Optim` (``optim=``): the optimiser, its schedule and the gradient's scale;
- :class:`Loss` (``loss=``): which ELBO estimate the steps follow;
- :class:`Engine` (``engine=``): how and where each step runs (:mod:`zoo.training.rules` says which
  settings combine);
- :class:`Run` (``run=``): what watches and keeps the run (progress, callbacks, the divergence
  policy, checkpoints).

A field's ``metadata["cli"]`` holds the ``argparse`` keywords of its flag (``--field-name``;
:mod:`zoo.cli.parser`). A group's field passed as a keyword of its own
(``zoo.fit(..., optimizer="sgd")``) is refused, naming its group.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch

from zoo.arguments import check_choice, check_positive, is_int
from zoo.inference import estimators
from zoo.inference.objective import check_elbo, check_jit
from zoo.runtime import distributed
from zoo.runtime.threads import check_threads
from zoo.training import option_checks as checks
from zoo.training.divergence import check_on_divergence
from zoo.training.optim import check_optimizer
from zoo.training.option_names import OptionGroup
from zoo.training.option_values import (
    devices_value,
    jit_value,
    positive_float,
    positive_int,
    steps_between_value,
    threads_value,
)
from zoo.training.refresh import STATISTICS

if TYPE_CHECKING:  # annotations only
    from guides.registry import Recipe


def _cli(help: str, **kwargs) -> dict:
    return {"cli": {"help": help, **kwargs}}


@dataclass(frozen=True)
class Optim(OptionGroup):
    """The optimiser of a fit.

    Attributes
    ----------
    optimizer : {"adam", "adamw", "sgd"} or torch optimizer class
        Torch's Adam, AdamW and SGD are built fused where the device allows.
    optimizer_options : mapping, optional
        Extra optimiser arguments, e.g. ``{"momentum": 0.9}``.
    lr_schedule : callable or {"exponential", "cosine"}, optional
        ``step -> factor`` multiplying ``lr`` (a ``LambdaLR``), e.g. Posch & Pilz's
        ``lambda i: (1 + 1e-4 * i) ** -0.75``; or a named schedule over the run's steps:
        ``"exponential"`` decays tenfold, ``"cosine"`` to a hundredth
        (:data:`zoo.training.optim.SCHEDULES`).
    lr_multipliers : mapping, optional
        ``fnmatch`` pattern over guide parameter names -> learning-rate factor, e.g.
        ``{"*.gamma*": 50.0}`` for the correlation parameters of the tridiagonal family
        (names look like ``sites.fc1.weight.gamma_unconstrained``).
    clip_grad_norm : float, optional
        Clip the global gradient norm to this value.
    per_example : bool, default False
        Optimise ``-ELBO / N`` instead of ``-ELBO`` (the same optimum; gradients ``N`` times
        smaller), for SGD learning rates quoted for per-example losses, as in most papers; Adam
        is insensitive to the scale. Reported losses stay ``-ELBO``.
    """

    optimizer: str | type = field(
        default="adam", metadata=_cli("optimiser", choices=("adam", "adamw", "sgd"))
    )
    optimizer_options: Mapping | None = None
    lr_schedule: Callable[[int], float] | str | None = field(
        default=None,
        metadata=_cli("learning-rate schedule over the run", choices=("exponential", "cosine")),
    )
    lr_multipliers: Mapping[str, float] | None = None
    clip_grad_norm: float | None = field(
        default=None, metadata=_cli("clip the global gradient norm", type=positive_float)
    )
    per_example: bool = field(
        default=False,
        metadata=_cli("optimise -ELBO / N (SGD rates quoted per example)", action="store_true"),
    )

    def __post_init__(self):
        check_optimizer(self.optimizer)
        check_positive(clip_grad_norm=self.clip_grad_norm)
        checks.check_optimizer_options(self.optimizer_options)
        checks.check_multipliers(self.lr_multipliers)
        checks.check_schedule(self.lr_schedule)


@dataclass(frozen=True)
class Loss(OptionGroup):
    """The ELBO estimate a fit's steps follow (:class:`zoo.Objective` takes the same).

    Attributes
    ----------
    elbo : {"trace", "meanfield"}, optional
        ``Trace_ELBO`` (Monte Carlo KL) or ``TraceMeanField_ELBO`` (closed-form KL where one is
        registered, which holds for every family here against Normal priors). ``None`` (the
        default): the family's (its ``guides.Recipe``: ``"meanfield"`` for the matrix normal),
        else ``"trace"``.
    estimator : {"reparam", "local", "flipout", "auto"}, optional
        How layers see the weight posterior (:mod:`zoo.inference.estimators`): one shared weight
        draw per step; local reparameterisation (pre-activations sampled per example: diagonal and
        matrix-normal linear layers); Flipout (sign-decorrelated draws per example: diagonal
        linear and convolution layers); or ``"auto"``, the local reparameterisation on the linear
        layers where the family says it is cheaper than a draw. Sites out of reach keep
        ``"reparam"``; the served sites are listed in ``result.options["estimator_sites"]``.
        ``"local"`` and ``"flipout"`` need ``num_particles=1`` (``"auto"`` draws with several).
        ``None`` (the default): the family's (``"auto"`` for the matrix normal), else
        ``"reparam"``. ``result.options`` records the ELBO and estimator that ran.
    num_particles : int, default 1
        ELBO samples per step, vectorised into one batched pass.
    kl_weight : float or callable, default 1.0
        Factor on the prior-minus-guide (KL) part of the ELBO, or ``step -> factor`` for
        annealing. ``1`` is the true ELBO.
    map_start : {"auto", True, False}, default "auto"
        Start a fit from scratch with a MAP phase inside the same budget, then the family at
        the MAP weights (:mod:`zoo.training.map_start`, which says where ``"auto"`` applies);
        ``False``: the model's ELBO from the family's own initialisation all the way.
    """

    elbo: str | None = field(
        default=None,
        metadata=_cli(
            "Monte Carlo KL (trace) or closed-form KL (meanfield); default: the family's",
            choices=("trace", "meanfield"),
        ),
    )
    estimator: str | None = field(
        default=None,
        metadata=_cli(
            "weight estimator; default: the family's",
            choices=("reparam", "local", "flipout", "auto"),
        ),
    )
    num_particles: int = field(default=1, metadata=_cli("ELBO samples per step", type=positive_int))
    kl_weight: float | Callable[[int], float] = field(
        default=1.0, metadata=_cli("factor on the KL term", type=positive_float)
    )
    map_start: bool | str = field(default="auto", metadata=_cli("MAP phase first", type=jit_value))

    def __post_init__(self):
        checks.check_map_start(self.map_start)
        check_positive(num_particles=self.num_particles)
        checks.check_kl_weight(self.kl_weight)
        if self.elbo is not None:
            check_elbo(self.elbo)
        if self.estimator is not None:
            estimators.check_estimator(self.estimator)

    def resolved(self, recipe: Recipe) -> Loss:
        """This group with ``elbo`` and ``estimator`` given where they were ``None``: the
        family's ``recipe`` (a ``guides.Recipe``), else ``"trace"`` and ``"reparam"``. A
        family's ELBO beside its ``"auto"`` estimator stays ``None``: the objective takes it
        where the estimator serves a layer, ``"trace"`` where it serves none
        (:class:`zoo.Objective`)."""
        estimator = self.estimator or recipe.estimator or "reparam"
        elbo: str | None = self.elbo or recipe.elbo or "trace"
        if self.elbo is None and recipe.elbo is not None and estimator == "auto":
            elbo = None
        return dataclasses.replace(self, elbo=elbo, estimator=estimator)


@dataclass(frozen=True)
class Engine(OptionGroup):
    """How and where each step of a fit runs (:mod:`zoo.training.rules` has the table of which
    settings combine; ``result.options`` records what ran).

    Attributes
    ----------
    device : "auto", "cpu", "cuda" or torch.device
        ``"auto"`` uses CUDA when available (or the device the environment variable
        ``ZOO_DEVICE`` names, e.g. ``ZOO_DEVICE=cpu``). Model, data and guide all move there.
    threads : "auto", int or None, default "auto"
        Torch's intra-op CPU threads during the fit, the caller's setting restored afterwards.
        ``"auto"``: one thread when the forward pass on a minibatch is small
        (:data:`zoo.runtime.threads.SMALL_STEP_FLOPS`), torch's setting otherwise and on CUDA
        (:mod:`zoo.runtime.threads`). ``None``: torch's setting as it is.
    jit : "auto", bool, default "auto"
        Evaluate the loss through a graph traced once per minibatch shape
        (:mod:`zoo.inference.compiled`): the same loss and gradients for the same draws, without
        the per-step Python of Pyro's traces. ``"auto"`` compiles ``zoo`` models with a ``guides``
        family and one particle, at any size, and falls back to the eager loss (with a warning)
        if a graph fails its check against it; ``True`` raises instead; ``False`` never
        compiles. The first step and the
        check of the last update are always eager (a one-step fit traces nothing).
    check_every : "auto" or int, default "auto"
        Steps between the host's reads of the loss (each read waits for the device). With
        ``k > 1`` the divergence test runs on the device, the fused optimiser skips a
        non-finite update there, and the host reads ``k`` steps at once (also at epoch ends,
        checkpoints, the end, and every step for callbacks). ``"auto"``: 1 on the CPU and
        across processes, else :data:`zoo.training.rules.CUDA_CHECK_EVERY`.
    cuda_graph : "auto" or bool, default "auto"
        Capture the whole step (loss, gradients, norm, update) as a CUDA graph and replay it
        (:mod:`zoo.training.cuda_graph`). Needs CUDA, the compiled loss, one process and a fused
        "adam", "adamw" or "sgd". ``"auto"``: on whenever the fit has them (off on the CPU; on CUDA
        ``result.options["cuda_graph"]`` says why when off); ``True``: refused before training
        when one is missing. The first replay is checked against the same step taken eagerly; a
        capture or a check that fails warns once and the fit goes on eagerly.
    accumulate : int, default 1
        Minibatches per optimiser step: the step's loss is the mean of its minibatches' full-data
        ``-ELBO`` estimates weighted by their sizes, so ``k`` minibatches of ``B`` give the
        gradient of one minibatch of ``k B`` (:mod:`zoo.inference.elbo`). ``num_steps`` and epochs
        count optimiser steps.
    accelerator, devices, num_nodes, strategy
        Fit across processes on Lightning Fabric (names and values as Lightning's, e.g.
        ``devices=4, num_nodes=2, strategy="ddp", accelerator="gpu"``); the defaults run in
        this process on ``device``. Under ``torchrun`` or SLURM pass the numbers the job was
        started with; otherwise Lightning starts the other processes. Each rank draws its own
        minibatches (its shard of every epoch's shuffle) and weights; the ranks' gradients are
        averaged, an unbiased estimate of the full-data ELBO's (:mod:`zoo.runtime.distributed`).
        Rank 0 shows the progress bar and writes the checkpoints; every rank returns the same fitted
        guide. Needs ``lightning`` (the ``distributed`` extra).
    """

    device: str | torch.device = field(default="auto", metadata=_cli("auto, cpu or cuda"))
    threads: int | str | None = field(
        default="auto",
        metadata=_cli("intra-op CPU threads", type=threads_value, metavar="{auto,N}"),
    )
    jit: bool | str = field(
        default="auto", metadata=_cli("compiled loss", type=jit_value, metavar="{auto,true,false}")
    )
    check_every: int | str = field(
        default="auto",
        metadata=_cli(
            "steps between the host's reads of the loss",
            type=steps_between_value,
            metavar="{auto,N}",
        ),
    )
    cuda_graph: bool | str = field(
        default="auto",
        metadata=_cli(
            "replay each step from a CUDA graph (the flag alone: true)",
            type=jit_value,
            metavar="{auto,true,false}",
            nargs="?",
            const=True,
        ),
    )
    accumulate: int = field(
        default=1, metadata=_cli("minibatches per optimiser step", type=positive_int)
    )
    accelerator: str = field(default="auto", metadata=_cli("cpu, gpu or auto", one_fit=True))
    devices: int | str = field(
        default=1,
        metadata=_cli("devices per node: a count, or 'auto'", type=devices_value, one_fit=True),
    )
    num_nodes: int = field(default=1, metadata=_cli("machines", type=positive_int, one_fit=True))
    strategy: str = field(
        default="auto", metadata=_cli("ddp, ddp_spawn, ... (as Lightning's)", one_fit=True)
    )

    def __post_init__(self):
        check_threads(self.threads)
        check_jit(self.jit)
        every = self.check_every
        if every != "auto" and (isinstance(every, str) or not is_int(every) or every < 1):
            raise ValueError(f"check_every must be 'auto' or a positive integer, got {every!r}")
        if not isinstance(self.cuda_graph, bool) and self.cuda_graph != "auto":
            raise ValueError(f"cuda_graph must be 'auto', True or False, got {self.cuda_graph!r}")
        check_positive(accumulate=self.accumulate, num_nodes=self.num_nodes)
        checks.check_device(self.device)
        checks.check_devices(self.devices)

    @property
    def distributed(self) -> bool:
        """Whether the fit runs across processes (:func:`zoo.runtime.distributed.requested`)."""

        return distributed.requested(self.devices, self.num_nodes, self.strategy)


@dataclass(frozen=True)
class Run(OptionGroup):
    """What watches and keeps a fit.

    Attributes
    ----------
    progress : bool, default True
        Show a tqdm progress bar.
    callbacks : iterable of callables
        Called as ``cb(CallbackView)`` after every step; a truthy return stops the fit.
    on_divergence : {"raise", "skip"}
        On a NaN/inf loss or gradient the guide goes back to parameters whose loss and
        gradients were finite (the message names the step), then: raise
        :class:`zoo.FitDivergedError`, or skip the step and go on (a warning counts the skipped
        steps; ``MAX_CONSECUTIVE_SKIPS`` in a row raise); see :mod:`zoo.training.divergence`.
    checkpoint : path, optional
        Write a checkpoint (plain data, :mod:`zoo.training.checkpoint`) here, atomically, every
        ``checkpoint_every`` steps (default: every epoch's end), at the end, and on Ctrl-C.
    checkpoint_every : int, optional
        Steps between checkpoints.
    resume : path, optional
        Continue from a checkpoint written by a fit with the same arguments (the same family:
        another is refused). With in-memory data on the CPU the resumed fit ends with the same
        parameters as an uninterrupted one. Ctrl-C during a fit returns the partial result
        (``result.interrupted`` is True).
    statistics : {"per_draw", "refresh", "running"}
        Batch norm's statistics after the fit. ``"per_draw"`` (the default): the running
        statistics re-estimated at the fitted posterior over one pass of the training
        minibatches (:mod:`zoo.training.refresh`), the model keeping that pass's first inputs
        (at most 512; a saved fit holds them), on which every prediction estimates each weight
        draw's own statistics (:mod:`zoo.models.per_draw`); during the fit it holds a sample
        of the training inputs, so a callback's or an interrupted fit's prediction does too.
        ``"refresh"``: the pass only, every draw reading one set. ``"running"``: the steps'.
    """

    progress: bool = field(
        default=True,
        metadata=_cli(
            "no progress bar (by default one is shown)", action="store_false", flag="--quiet"
        ),
    )
    callbacks: Iterable[Callable] = ()
    on_divergence: str = field(
        default="raise",
        metadata=_cli("on a non-finite loss: raise, or skip the step", choices=("raise", "skip")),
    )
    checkpoint: str | os.PathLike | None = field(
        default=None, metadata=_cli("write a checkpoint here (atomically)", one_fit=True)
    )
    checkpoint_every: int | None = field(
        default=None,
        metadata=_cli("steps between checkpoints (default: epoch ends)", type=positive_int),
    )
    resume: str | os.PathLike | None = field(
        default=None, metadata=_cli("continue the fit of this checkpoint", one_fit=True)
    )
    statistics: str = field(
        default="per_draw",
        metadata=_cli(
            "batch norm's statistics after the fit: each draw's own on kept training inputs, "
            "re-estimated once, or the steps' running averages",
            choices=STATISTICS,
        ),
    )

    def __post_init__(self):
        check_on_divergence(self.on_divergence)
        check_choice("statistics", self.statistics, STATISTICS)
        check_positive(checkpoint_every=self.checkpoint_every)
        checks.check_run(self)


#: ``zoo.fit``'s group parameters and their classes.
GROUPS: dict[str, type] = {"optim": Optim, "loss": Loss, "engine": Engine, "run": Run}


G = TypeVar("G", Optim, Loss, Engine, Run)


def group(cls: type[G], value: G | Mapping | None) -> G:
    """``value`` as a ``cls`` group: ``None`` gives the defaults, a mapping its fields."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**value)  # a key that is no field: OptionGroup's error, naming its place
    raise TypeError(f"expected zoo.{cls.__name__} or a dict of its fields, got {value!r}")


def grouped(options: Mapping, groups: Mapping[str, type] = GROUPS) -> dict:
    """A flat mapping of options, as a sweep keeps its rows (``{"jit": False, "lr": 0.1}``),
    as ``zoo.fit``'s arguments: each group field moved into its group (merged into a group
    the mapping also holds), the rest kept. ``zoo.fit(model, guide, data, **grouped(row))``."""
    owners = flat_keywords(groups)
    out = {k: v for k, v in options.items() if k not in owners}
    for key, value in options.items():
        if key in owners:
            name = owners[key]
            out[name] = dataclasses.replace(group(groups[name], out.get(name)), **{key: value})
    return out


def flat_keywords(groups: Mapping[str, type] = GROUPS) -> dict[str, str]:
    """Every field of ``groups`` -> the group parameter that holds it."""
    return {f.name: name for name, cls in groups.items() for f in dataclasses.fields(cls)}
