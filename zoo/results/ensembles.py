"""A deep ensemble (:class:`Ensemble`, made by :func:`zoo.ensemble`): ``K`` fits of one model
whose predictive is the equal mixture of theirs,

    p(y | x, D) = 1/K sum_k p_k(y | x),

where ``p_k`` is member ``k``'s predictive: one network for a point mass (the paper's ensemble
of MAP networks), or its own posterior predictive for a variational family."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from zoo.models.predictions import PredictionT, mixture
from zoo.results.posterior import Posterior, PredictOptions
from zoo.results.variational import FitResult, check_fit_payload, fit_from_payload
from zoo.storage import files

#: ``Ensemble.options["rate"]`` where the first member's range test chose every member's rate
#: (``zoo.ensemble`` given no ``lr``).
SHARED_RATE = "range test of the first member, given to the others"


@dataclass(repr=False)
class Ensemble(Posterior[PredictionT], kind="ensemble"):
    """``K`` fits of one model whose predictive is their equal mixture: a
    :class:`zoo.Posterior` whose draws are the members' (the members are its chains).

    Attributes
    ----------
    members : list of FitResult
        The fits, member ``k`` seeded ``seed + k``.
    options : dict
        How the ensemble was made: ``members``, ``family``, ``seed`` (and ``noise`` when given;
        ``rate``: :data:`SHARED_RATE` when the first member's range test chose the rate every
        member ran at).
    """

    members: list[FitResult]
    options: dict = field(default_factory=dict)

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Posterior:
        """:func:`ensemble_from_payload` (``zoo.load``'s reader of this kind)."""
        return ensemble_from_payload(payload, path, model, map_location)

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
    def model(self) -> Any:
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

    def fitting(self) -> dict:
        """See :meth:`zoo.Posterior.fitting`: the members' steps together, the geometric mean
        of their rates, and their rule with the range of rates where they differ (the first
        member's range test where it chose every member's rate, ``options["rate"]``)."""
        parts = [m.fitting() for m in self.members]
        rates = [p["lr"] for p in parts if p["lr"] > 0]
        rules = sorted({p["lr_rule"].split(" (")[0] for p in parts})
        rule = ", ".join(rules) + f" (each of {len(parts)} members)"
        if self.options.get("rate") == SHARED_RATE:
            rule = f"{parts[0]['lr_rule']} of the first member, given to the other {len(parts) - 1}"
        if rates and max(rates) > min(rates):
            rule += f", rates {min(rates):.3g} to {max(rates):.3g}"
        mean = math.exp(sum(math.log(r) for r in rates) / len(rates)) if rates else math.nan
        return {"steps": sum(p["steps"] for p in parts), "lr": mean, "lr_rule": rule}

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

    def sample(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (S, *shape)}``: every member's draws (:meth:`draws_per_member` each,
        member ``k`` seeded ``seed + k``) in member order, ``S = K m``."""
        chains = self.chains(num_samples, seed)
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in chains.items()}

    def chains(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (K, m, *shape)}``: the members as chains, member ``k``'s
        ``m = draws_per_member(num_samples)`` draws seeded ``seed + k``."""
        num_samples = self.sample_size(num_samples, seed)
        per = self.draws_per_member(num_samples)
        parts = [m.sample(per, None if seed is None else seed + k)
                 for k, m in enumerate(self.members)]  # fmt: skip
        return {name: torch.stack([p[name] for p in parts]) for name in parts[0]}

    def prediction_blocks(self, x: torch.Tensor, options: PredictOptions) -> Iterator[PredictionT]:
        """The mixture predictive on ``x``: each member's prediction blocks (its own network,
        batch norm statistics included; :meth:`draws_per_member` networks, member ``k``
        seeded ``seed + k``) in member order, ``S = K m`` sampled networks in all, the same
        ``Prediction`` type as a fit's."""
        per = self.draws_per_member(self.sample_size(options.num_samples, options.seed))
        for k, member in enumerate(self.members):
            seed = None if options.seed is None else options.seed + k
            own = dataclasses.replace(options, num_samples=per, seed=seed)
            yield from member.prediction_blocks(x, own)

    def predict_draws(
        self, x: torch.Tensor, draws: dict, options: PredictOptions | None = None
    ) -> PredictionT:
        """The prediction of :meth:`sample`'s draws, member ``k``'s ``k``-th block of them on
        member ``k``'s network."""
        options = options or self.draw_options(draws)
        per = next(iter(draws.values())).shape[0] // len(self.members)
        parts = [
            member.predict_draws(
                x, {n: v[k * per : (k + 1) * per] for n, v in draws.items()}, options
            )  # fmt: skip
            for k, member in enumerate(self.members)
        ]
        return cast(PredictionT, mixture(parts))

    def describe(self) -> dict:
        """The members and their family."""
        family = self.options.get("family", self.members[0].family)
        return {"inference": f"deep ensemble of {len(self.members)} {family} fits"}

    def payload(self) -> dict:
        """Every member's fit as :meth:`zoo.FitResult.save` writes it, and the options."""
        return {
            "members": [m.payload() for m in self.members],
            "options": files.plain_data(self.options),
        }


def ensemble_from_payload(payload: dict, path, model, map_location) -> Ensemble:
    """The ensemble of a file's ``payload``: each member checked as a fit file is, then
    rebuilt on its saved model, or on a copy of ``model`` when one is given."""
    files.require(payload, ("members", "options"), path)
    if not isinstance(payload["members"], list) or not payload["members"]:
        raise ValueError(f"{path}: the ensemble has no members (the file was changed)")
    if not isinstance(payload["options"], dict):
        raise ValueError(f"{path}: the options entry is not a mapping (the file was changed)")
    fits = []
    for k, member in enumerate(payload["members"]):
        where = f"{path} (member {k})"
        if not isinstance(member, dict):
            raise ValueError(f"{where}: not a fit entry (the file was changed)")
        check_fit_payload(member, where)
        if _architecture(member) != _architecture(payload["members"][0]):
            raise ValueError(
                f"{where}: its model (network or likelihood) is not member 0's; every member "
                "of an ensemble is a fit of one model (the file was changed)"
            )
        member = {"format": files.FORMAT, "version": files.VERSION, "kind": "fit", **member}
        own = None if model is None else copy.deepcopy(model)  # a model of one's own per member
        fits.append(fit_from_payload(member, where, own, map_location))
    return Ensemble(fits, dict(payload["options"]))


def _architecture(member: dict):
    """A member's model spec without its prior (a learned prior's spec may hold its values)."""
    spec = member["model"]["spec"]
    if isinstance(spec, dict) and isinstance(spec.get("args"), dict):
        return {**spec, "args": {k: v for k, v in spec["args"].items() if k != "prior"}}
    return spec
