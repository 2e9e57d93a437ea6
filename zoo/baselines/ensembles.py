"""Deep ensembles (Lakshminarayanan et al. 2017): ``K`` independent fits of one model, seeded
apart, whose predictive is the equal mixture of theirs,

    p(y | x, D) = 1/K sum_k p_k(y | x),

where ``p_k`` is member ``k``'s predictive: one network for a point mass (``family="map"``, the
paper's ensemble of MAP networks), or its own posterior predictive for a variational family (an
ensemble of variational posteriors is a mixture of them). Members are fitted one after another
in this process, each by :func:`zoo.fit` with the seed ``seed + k``; the ensemble predicts,
evaluates, saves and loads like a fit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from zoo.evaluation.scoring import evaluate
from zoo.models.predictions import Prediction, mixture
from zoo.runtime import files
from zoo.runtime.arguments import check_model_factory, check_positive, check_seed
from zoo.training.options import Engine, Run, group, grouped
from zoo.training.result import FitResult, check_fit_payload, from_payload


@dataclass
class Ensemble:
    """``K`` fits of one model whose predictive is their equal mixture.

    Attributes
    ----------
    members : list of FitResult
        The fits, member ``k`` seeded ``seed + k``.
    options : dict
        How the ensemble was made: ``members``, ``family``, ``seed``.
    """

    members: list[FitResult]
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.members:
            raise ValueError("an ensemble needs at least one member")

    def __repr__(self) -> str:
        return (
            f"Ensemble({len(self.members)} x {self.options.get('family', self.members[0].family)},"
            f" model={type(self.model).__name__}, wall_time={self.wall_time:.1f} s, "
            f"device={self.device})"
        )

    @property
    def model(self):
        """The first member's model (every member's has the same sites and likelihood)."""
        return self.members[0].model

    @property
    def device(self) -> torch.device:
        return self.members[0].device

    @property
    def wall_time(self) -> float:
        """Seconds the members' training loops took, together."""
        return float(sum(m.wall_time for m in self.members))

    @property
    def steps(self) -> int:
        """Optimiser updates of all members together."""
        return sum(m.steps for m in self.members)

    def num_variational_parameters(self) -> int:
        """Parameters of all members' guides together."""
        return sum(m.guide.num_variational_parameters() for m in self.members)

    def draws_per_member(self, num_samples: int) -> int:
        """Networks drawn from each member for ``num_samples``: one from a point mass (its
        draws are all the same network), else ``ceil(num_samples / K)``, so that every member
        weighs the same in the mixture."""
        if all(m.options.get("guide") == "map" for m in self.members):
            return 1
        return math.ceil(num_samples / len(self.members))

    def predict(
        self,
        x: torch.Tensor,
        num_samples: int = 100,
        batch_size: int | None = None,
        progress: bool = True,
        seed: int | None = 0,
        threads: int | str | None = "auto",
    ) -> Prediction:
        """The mixture predictive on ``x``: each member's prediction
        (:meth:`zoo.FitResult.predict`, :meth:`draws_per_member` networks, member ``k`` with
        the seed ``seed + k``) side by side, ``S = K m`` sampled networks in all, the same
        ``Prediction`` type as a fit's."""
        check_positive(num_samples=num_samples)
        check_seed(seed)
        per = self.draws_per_member(num_samples)
        parts = [
            member.predict(
                x,
                num_samples=per,
                batch_size=batch_size,
                progress=progress,
                seed=None if seed is None else seed + k,
                threads=threads,
            )
            for k, member in enumerate(self.members)
        ]
        return mixture(parts)

    def evaluate(
        self,
        data,
        num_samples: int = 100,
        batch_size: int | None = None,
        seed: int | None = 0,
        progress: bool = True,
        threads: int | str | None = "auto",
    ) -> dict[str, float]:
        """Held-out metrics of the mixture predictive, as :meth:`zoo.FitResult.evaluate`
        defines them for the model's likelihood."""
        options = dict(num_samples=num_samples, batch_size=batch_size, progress=progress)
        return evaluate(self, data, seed=seed, threads=threads, **options)

    def to_arviz(
        self,
        data=None,
        num_samples: int = 200,
        var_names=None,
        seed: int | None = 0,
        progress: bool = True,
        threads: int | str | None = "auto",
    ):
        """ArviZ ``InferenceData`` with the members as chains; see
        :func:`zoo.arviz.ensemble_inference_data`."""
        from zoo.arviz import ensemble_inference_data

        return ensemble_inference_data(self, data, num_samples, var_names, seed, progress,
                                       threads)  # fmt: skip

    def save(self, path: str | os.PathLike) -> os.PathLike:
        """Write the ensemble to ``path`` (atomically) as one file of plain data: every
        member's fit as :meth:`zoo.FitResult.save` writes it. ``zoo.load(path)`` reads it."""
        return files.atomic_save(
            {
                "format": files.FORMAT,
                "version": files.VERSION,
                "kind": "ensemble",
                "members": [m.payload() for m in self.members],
                "options": files.plain_data(self.options),
            },
            path,
        )


def ensemble(
    model_factory: Callable,
    data,
    members: int = 5,
    family="map",
    seed: int = 0,
    progress: bool = True,
    processes: int | str = 1,
    **fit_options,
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
    **fit_options
        Passed to every :func:`zoo.fit` (``epochs``, ``lr``, the option groups ...). A
        ``run=zoo.Run(checkpoint=path)`` gives member ``k`` its own file,
        ``<path stem>.member<k><suffix>``; ``resume=path`` resumes every member whose file
        exists and fits the others from the start, so a stopped ensemble goes on where it
        was.

    Every argument is checked before the first member is fitted.
    """
    from zoo.baselines.ensemble_processes import fit_members, workers
    from zoo.training.fitting import fit
    from zoo.training.recipes import resolve_device

    check_model_factory(model_factory, "ensemble")
    check_ensemble(members, family, seed, processes)
    args = grouped(fit_options if "run" in fit_options else {"progress": False, **fit_options})
    device = resolve_device(group(Engine, args.get("engine")).device)
    count = workers(processes, members, device)
    run = group(Run, args.get("run"))
    member_args = [{**args, "run": member_run(run, k)} for k in range(members)]
    if count > 1:
        fits = fit_members(model_factory, family, data, seed, member_args, count, progress)
    else:
        fits = [
            fit(model_factory(), family, data, seed=seed + k, **member_args[k])
            for k in tqdm(range(members), desc="ensemble", unit="member", disable=not progress)
        ]
    name = family if isinstance(family, str) else fits[0].options.get("guide", fits[0].family)
    return Ensemble(fits, {"members": members, "family": name, "seed": seed})


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


def check_ensemble(members, family, seed, processes=1) -> None:
    """Refuse :func:`ensemble`'s ``members``, ``family``, ``seed`` or ``processes`` before any
    fit (what :func:`zoo.compare` checks of an ``"ensemble"`` row too)."""
    from guides import family as guide_family
    from zoo.baselines.ensemble_processes import check_processes

    check_processes(processes)
    if isinstance(members, bool) or not isinstance(members, int):
        raise TypeError(f"members must be an int (the number of fits), got {members!r}")
    if members < 1:
        raise ValueError(f"members must be an int >= 1 (the number of fits), got {members}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (member k is fitted with seed + k), got {seed!r}")
    if isinstance(family, str):
        guide_family(family)  # an unknown name fails now, not after the first member
    elif isinstance(family, torch.nn.Module):  # an AutoGuide instance is bound to one model
        raise TypeError(
            "an ensemble's family is a name or a guides.family(...) spec, not a guide "
            f"instance ({type(family).__name__}): every member needs a guide of its own"
        )


def ensemble_from_payload(payload: dict, path, model, map_location) -> Ensemble:
    """The ensemble of a file's ``payload``: each member checked as a fit file is, then
    rebuilt on its saved model, or on a copy of ``model`` when one is given."""
    files.require(payload, ("members", "options"), path)
    if not isinstance(payload["members"], list) or not payload["members"]:
        raise ValueError(f"{path}: the ensemble has no members (the file was changed)")
    fits = []
    for k, member in enumerate(payload["members"]):
        where = f"{path} (member {k})"
        if not isinstance(member, dict):
            raise ValueError(f"{where}: not a fit entry (the file was changed)")
        check_fit_payload(member, where)
        member = {"format": files.FORMAT, "version": files.VERSION, "kind": "fit", **member}
        own = None if model is None else copy.deepcopy(model)  # a model of one's own per member
        fits.append(from_payload(member, where, own, map_location))
    return Ensemble(fits, dict(payload["options"]))
