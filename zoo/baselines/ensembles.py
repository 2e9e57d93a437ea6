"""Deep ensembles (Lakshminarayanan et al. 2017): ``K`` independent fits of one model, seeded
apart, whose predictive is the equal mixture of theirs,

    p(y | x, D) = 1/K sum_k p_k(y | x),

where ``p_k`` is member ``k``'s predictive: one network for a point mass (``family="map"``, the
paper's ensemble of MAP networks), or its own posterior predictive for a variational family (an
ensemble of variational posteriors is a mixture of them). Members are fitted one after another
in this process, each by :func:`zoo.fit` with the seed ``seed + k`` (or in forked processes:
:mod:`zoo.baselines.ensemble_processes`). The result, :class:`zoo.Ensemble`
(:mod:`zoo.results.ensembles`), is a :class:`zoo.Posterior` like a fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm
from typing_extensions import Unpack

from guides import family as guide_family
from guides.registry import Family
from zoo.arguments import check_int, check_model_factory, is_number
from zoo.baselines import producers
from zoo.baselines.ensemble_processes import check_processes, fit_members, workers
from zoo.data.forms import Data
from zoo.models import build
from zoo.models.likelihoods import from_task
from zoo.results.ensembles import SHARED_RATE, Ensemble
from zoo.runtime.serial import one_at_a_time
from zoo.training.fitting import fit
from zoo.training.keywords import FitLength, fit_arguments, refuses_flat_keywords
from zoo.training.options import (
    Engine,
    Optim,
    Run,
    group,
)
from zoo.training.recipes import DEFAULT_SCHEDULE, resolve_device


@refuses_flat_keywords
@one_at_a_time
def ensemble(
    model_factory: Callable,
    data: Data,
    members: int = 5,
    family: str | type | Callable = "map",
    seed: int = 0,
    progress: bool = True,
    processes: int | str = 1,
    *,
    noise: str | float | None = None,
    **how: Unpack[FitLength],
) -> Ensemble:
    """Fit a deep ensemble: ``members`` independent :func:`zoo.fit` runs of ``model_factory()``
    on ``data``, member ``k`` with the seed ``seed + k`` (its initial weights, draws and
    minibatch order), with a progress bar over the members.

    Parameters
    ----------
    model_factory : callable
        ``() -> model``; called once per member, so that members share nothing.
    data
        Training data, as :func:`zoo.fit` takes it.
    members : int, default 5
        ``K``, the number of fits.
    family : str or guide, default "map"
        Each member's posterior family: ``"map"`` (a point mass: the ensemble of MAP networks
        of Lakshminarayanan et al.) or any family name or ``guides.family(...)`` spec, whose
        members' posteriors the ensemble mixes.
    seed : int, default 0
        Member ``k`` is fitted with ``seed + k``.
    progress : bool, default True
        A bar over the members (each member's own bar is off unless ``run=`` asks for it).
    processes : int or "auto", default 1
        Members fitted at once, each in a forked CPU process on one thread (``"auto"``: one
        per core on the CPU, one after another on a GPU); see
        :mod:`zoo.baselines.ensemble_processes`. ``1`` fits them one after another here.
    noise : {None, "heteroscedastic", "learned"} or float, default None
        Each regression member's observation noise. ``None`` keeps the factory's model (a
        zoo regression model's default: one learned noise level), so that the ensemble is the
        same model, likelihood and prior as every other row of a :func:`zoo.compare` and as
        the HMC reference, and the table compares posteriors, not models.
        ``"heteroscedastic"`` gives Lakshminarayanan et al.'s members, a mean and a variance
        per input (the last layer doubled: :class:`zoo.models.likelihoods.HeteroscedasticGaussian`),
        a different model that often predicts better where the noise varies with the input;
        ``"learned"`` or a standard deviation sets one noise level. The model is rebuilt from
        its ``spec()`` with that likelihood, so it must be a ``zoo.models`` class of a
        regression task.
    **how : FitLength
        Every member's :func:`zoo.fit` arguments (:class:`zoo.training.keywords.FitLength`:
        :class:`~zoo.training.keywords.HowToFit` without the ``seed``, which is the ensemble's). A
        ``run=zoo.Run(checkpoint=path)`` gives member ``k`` its own file,
        ``<path stem>.member<k><suffix>``; ``resume=path`` resumes every member whose file
        exists and fits the others from the start, so a stopped ensemble goes on where it
        was.

    Notes
    -----
    Every argument is checked before the first member is fitted. Members start from fresh
    initial weights, each its own seeded draw (the paper's source of diversity), also when
    ``model_factory`` converts a trained network (``zoo.models.from_module``): its
    deterministic parameters (batch norm's) and running statistics are kept, its sites are
    drawn anew. A guide factory of your own (a callable) decides for itself.

    The members share one rate, as the paper's do. Given no ``lr`` (or ``lr="auto"``), the
    first member is fitted first and, where it measured its rate with the range test
    (:mod:`zoo.training.rate`), the others are given the rate it chose and its schedule
    (:func:`shared_rate`): the test's steps are charged to the first member's budget only,
    and every other member runs its whole budget at that rate. Members in processes then
    start once the first has ended. ``options["rate"]`` says so.
    """
    check_model_factory(model_factory, "ensemble")
    check_ensemble(members, family, seed, processes, noise)
    if noise is not None:
        model_factory = with_noise(model_factory, noise)
    args = fit_arguments(False, how, "ensemble", FitLength)
    device = resolve_device(group(Engine, args.get("engine")).device)
    count = workers(processes, members, device)
    every = {k: {**args, "run": member_run(args["run"], k)} for k in range(members)}
    name = family if isinstance(family, str) else None
    family = fresh_start(family)
    bar = tqdm(total=members, desc="ensemble", unit="member", disable=not progress)
    with bar:
        if args.get("lr") not in (None, "auto"):  # a given rate: no member measures one
            fits = _fit_all(model_factory, family, data, seed, every, count, bar)
        else:  # the first member measures the rate the others are given
            fits = _fit_all(model_factory, family, data, seed, {0: every.pop(0)}, count, bar)
            rest = {k: shared_rate(a, fits[0]) for k, a in every.items()}
            fits += _fit_all(model_factory, family, data, seed, rest, count, bar)
    name = name or fits[0].options.get("guide", fits[0].family)
    settings = {"members": members, "family": name, "seed": seed}
    if members > 1 and fits[0].options.get("lr_test"):
        settings["rate"] = SHARED_RATE
    if noise is not None:
        settings["noise"] = noise
    return Ensemble(fits, settings)


def _fit_all(model_factory, family, data, seed: int, member_args: dict, count: int, bar):
    """Member ``k`` of ``member_args`` (``k -> its zoo.fit arguments``) fitted with the seed
    ``seed + k``, ``count`` at a time in forked processes when more than one, else here;
    ``bar`` advanced as each ends. The fits in member order."""
    if count > 1:
        return fit_members(model_factory, family, data, seed, member_args, count, bar)
    fits = []
    for k in sorted(member_args):
        fits.append(fit(model_factory(), family, data, seed=seed + k, **member_args[k]))
        bar.update(1)
    return fits


def shared_rate(args: dict, first) -> dict:
    """A member's ``zoo.fit`` arguments given the rate that the ensemble's ``first`` member's
    range test chose (its ``options["lr_test"]``; ``args`` unchanged where it measured none):
    ``lr`` and the schedule it ran at (the caller's ``lr_schedule``, else the default's tenfold
    decay). Each member then runs the whole budget at that rate: the test's steps are paid
    once, by the first member, not by every member."""
    record = first.options.get("lr_test")
    if not record:
        return args
    optim = group(Optim, args.get("optim"))
    schedule = optim.lr_schedule if optim.lr_schedule is not None else DEFAULT_SCHEDULE
    return {**args, "lr": float(record["lr"]),
            "optim": dataclasses.replace(optim, lr_schedule=schedule)}  # fmt: skip


def fresh_start(family):
    """``family`` with fresh initial means (``init_loc_fn="kaiming"``) where the members'
    guides are built by name or class: each member draws its own (seeded ``seed + k``), also
    for a converted trained network, whose weights every member would otherwise share. A
    guide factory of the user's is left as it is."""
    if isinstance(family, str) or isinstance(family, type):
        return guide_family(family, init_loc_fn="kaiming")
    if isinstance(family, Family) and "init_loc_fn" not in family.options:
        return guide_family(family.guide, **{**family.options, "init_loc_fn": "kaiming"})
    return family


def member_run(run: Run, k: int) -> Run:
    """Member ``k``'s ``run`` group: its own checkpoint file, and a resume only from its own
    file where one exists (``<stem>.member<k><suffix>``)."""
    if run.checkpoint is None and run.resume is None:
        return run

    def own(path):
        path = Path(path)
        return path.with_name(f"{path.stem}.member{k}{path.suffix}")

    checkpoint = None if run.checkpoint is None else own(run.checkpoint)
    resume = None if run.resume is None else own(run.resume)
    if resume is not None and not resume.exists():
        resume = None  # this member had not started: it is fitted from the start
    return dataclasses.replace(run, checkpoint=checkpoint, resume=resume)


def check_ensemble(members, family, seed, processes=1, noise=None) -> None:
    """Refuse :func:`ensemble`'s ``members``, ``family``, ``seed``, ``processes`` or ``noise``
    before any fit (what :func:`zoo.compare` checks of an ``"ensemble"`` row too)."""
    check_processes(processes)
    if noise is not None:
        check_noise(noise)
    check_int("members", members, 1, meaning="the number of fits")
    check_int("seed", seed, 0, meaning="member k is fitted with seed + k")
    if isinstance(family, str):
        guide_family(family)  # an unknown name fails now, not after the first member
    elif isinstance(family, torch.nn.Module):  # an AutoGuide instance is bound to one model
        raise TypeError(
            "an ensemble's family is a name or a guides.family(...) spec, not a guide "
            f"instance ({type(family).__name__}): every member needs a guide of its own"
        )


def check_noise(noise) -> None:
    """Refuse a member ``noise`` that no regression likelihood takes."""
    ok = noise in ("heteroscedastic", "learned") or (is_number(noise) and noise > 0)
    if not ok:
        raise ValueError(
            f"noise must be None (the factory's model), 'heteroscedastic' (a mean and a "
            f"variance per input), 'learned' or a positive standard deviation, got {noise!r}"
        )


def with_noise(model_factory: Callable, noise) -> Callable:
    """``model_factory`` whose models are rebuilt from their ``spec()`` with the regression
    likelihood of ``noise``; the first model is checked here, before any fit."""

    def spec_of(model) -> dict:
        spec = model.spec() if hasattr(model, "spec") else None
        task = getattr(getattr(model, "likelihood", None), "task", None)
        if spec is None or task != "regression" or "likelihood" not in spec.get("args", {}):
            raise ValueError(
                f"ensemble(noise={noise!r}) rebuilds each member with that likelihood, which "
                f"needs a zoo.models regression model, got {type(model).__name__} "
                f"(task {task!r}): build the factory's model with the noise instead (e.g. "
                "zoo.models.BayesianMLP(..., noise='heteroscedastic'))"
            )
        likelihood = from_task("regression", noise).spec()
        return {**spec, "args": {**spec["args"], "likelihood": likelihood}}

    spec_of(model_factory())  # refused now, not after the first member

    def factory():
        return build(spec_of(model_factory()))

    return factory


#: What an ``"ensemble"`` row of :func:`zoo.compare` may set (:func:`ensemble`'s options).
ENSEMBLE_OPTIONS = frozenset({"members", "family", "seed", "processes", "noise"})


def _check_row(options: dict) -> None:
    if not set(options) <= ENSEMBLE_OPTIONS:
        raise ValueError(f"it takes the options {sorted(ENSEMBLE_OPTIONS)}, got {sorted(options)}")
    check_ensemble(**{"members": 5, "family": "map", "seed": 0, **options})


def _make_row(model_factory, family, options, train, args, progress) -> Ensemble:
    own = {k: args.pop(k) for k in ("seed",) if k in args}
    return ensemble(model_factory, train, **{**own, **options}, progress=progress, **args)


producers.register("ensemble", _check_row, _make_row)
