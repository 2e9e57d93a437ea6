"""What :func:`zoo.reference` returns: the chains' draws with the sampler's statistics, a
:class:`zoo.Posterior` like every other kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from zoo.models.predictions import PredictionT
from zoo.results.draws import DrawnPosterior, restore_drawn_model
from zoo.storage import checks as file_checks
from zoo.storage import files, model_form


@dataclass(repr=False)
class Reference(DrawnPosterior[PredictionT], kind="reference"):
    """Draws of the posterior by NUTS, ``C`` chains of ``D`` draws each.

    Attributes
    ----------
    model
        The model sampled (on ``device``).
    draws : dict of Tensor
        ``{site: (C, D, *site_shape)}``, in the constrained space (a noise is a standard
        deviation, positive).
    stats : dict of Tensor
        ``{name: (C, D)}``: ``diverging`` (0/1), ``tree_depth``, ``step_size``, ``energy``,
        ``lp``, ``acceptance_rate`` (see :mod:`zoo.mcmc.chain`).
    wall_time : float
        Seconds of sampling (warm-up included) in the call that returned this.
    options : dict
        The run's settings: chains, warmup, draws, seed, NUTS options, processes, examples.
    device : torch.device
    """

    model: Any
    draws: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    wall_time: float = 0.0
    options: dict = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __repr__(self) -> str:
        c, d = self.shape
        return (
            f"Reference(model={type(self.model).__name__}, chains={c}, draws={d}, "
            f"divergences={int(self.stats['diverging'].sum())}, "
            f"wall_time={self.wall_time:.1f} s)"
        )

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Reference:
        """:func:`reference_from_payload` (``zoo.load``'s reader of this kind)."""
        return reference_from_payload(payload, path, model, map_location)

    @property
    def divergences(self) -> int:
        """Divergent transitions among the kept draws (0 is what a trustworthy run shows)."""
        return int(self.stats["diverging"].sum())

    def describe(self) -> dict:
        """NUTS through Pyro."""
        return {"inference": "NUTS (pyro.infer.mcmc)"}

    def sample_stats(self) -> dict:
        """NUTS' statistics per draw, ``(C, D)`` arrays: ``diverging`` as booleans,
        ``tree_depth``, ``step_size``, ``energy``, ``lp``, ``acceptance_rate``."""
        stats = {name: value.cpu().numpy() for name, value in self.stats.items()}
        stats["diverging"] = stats["diverging"].astype(bool)
        stats["tree_depth"] = stats["tree_depth"].astype(np.int64)
        return stats

    def diagnostics(self, x: torch.Tensor | None = None) -> dict[str, float]:
        """Convergence in numbers: divergences, ``lp``'s R-hat and bulk ESS, and with inputs
        ``x`` the worst R-hat and ESS of the network outputs on them (function space, which
        hidden-unit permutations do not scramble as they do raw weights)."""
        from zoo.evaluation.arviz import chain_diagnostics

        quantities = {"lp": self.stats["lp"]}
        if x is not None:
            c, d = self.shape
            out = self.predict(x, progress=False).outputs
            quantities["outputs"] = out.reshape(c, d, *out.shape[1:])
        return {"divergences": self.divergences, **chain_diagnostics(quantities)}

    def payload(self) -> dict:
        """The model's spec and buffers, the draws, the statistics, the time and options."""
        return {
            "model": model_form.model_payload(self.model),
            "draws": {k: v.cpu() for k, v in self.draws.items()},
            "stats": {k: v.cpu() for k, v in self.stats.items()},
            "wall_time": float(self.wall_time),
            "options": files.plain_data(self.options),
        }


def reference_from_payload(payload: dict, path, model=None, map_location="cpu") -> Reference:
    """The :class:`Reference` of a file's ``payload`` (see :meth:`Reference.save`), checked
    before anything is built from it."""
    files.require(payload, ("model", "draws", "stats", "wall_time", "options"), path)
    file_checks.check_tensors(payload["draws"], path, "draws")
    file_checks.check_tensors(payload["stats"], path, "stats")
    model = restore_drawn_model(payload, path, model, map_location)
    return Reference(
        model=model,
        draws={k: v.to(map_location) for k, v in payload["draws"].items()},
        stats=dict(payload["stats"]),
        wall_time=payload["wall_time"],
        options=dict(payload["options"]),
        device=torch.device(map_location),
    )
