"""What :func:`zoo.reference` returns: the chains' draws, predicting like a fit."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from zoo.data.checks import check_labelled_data, gather_tensors
from zoo.models import stored
from zoo.runtime import files


@dataclass
class Reference:
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

    model: object
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

    @property
    def shape(self) -> tuple[int, int]:
        """``(chains, draws per chain)``."""
        return tuple(next(iter(self.stats.values())).shape)

    @property
    def divergences(self) -> int:
        """Divergent transitions among the kept draws (0 is what a trustworthy run shows)."""
        return int(self.stats["diverging"].sum())

    def flat_draws(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """``{site: (S, *shape)}``: every chain's draws in chain order, or ``num_samples`` of
        them evenly spaced over that order (so every chain contributes)."""
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in self.draws.items()}
        total = next(iter(flat.values())).shape[0]
        if num_samples is None or num_samples >= total:
            return flat
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        index = torch.linspace(0, total - 1, num_samples).round().long()
        return {k: v[index.to(v.device)] for k, v in flat.items()}

    def predict(
        self,
        x: torch.Tensor,
        num_samples: int | None = None,
        batch_size: int | None = None,
        progress: bool = True,
        threads: int | str | None = "auto",
    ):
        """The posterior predictive on ``x`` from the draws (all, or ``num_samples`` evenly
        spaced), as :meth:`zoo.FitResult.predict` returns it."""
        from zoo.evaluation.predictive import predict

        return predict(
            self.model,
            None,
            x,
            params=self.flat_draws(num_samples),
            batch_size=batch_size,
            progress=progress,
            threads=threads,
        )

    def evaluate(
        self,
        data,
        num_samples: int | None = None,
        batch_size: int | None = None,
        progress: bool = True,
        threads: int | str | None = "auto",
    ) -> dict[str, float]:
        """Held-out metrics, as :meth:`zoo.FitResult.evaluate` defines them."""
        x, y = gather_tensors(data)
        check_labelled_data(self.model, x, y, self.device)
        pred = self.predict(x, num_samples, batch_size, progress, threads)
        return self.model.likelihood.metrics(pred, y.to(pred.outputs.device))

    def to_arviz(self, data=None, var_names=None, seed: int | None = 0, progress: bool = True):
        """ArviZ ``InferenceData`` with a ``chain`` dimension and NUTS' ``sample_stats``, so
        ``az.summary`` reports R-hat and ESS; see :func:`zoo.arviz.reference_inference_data`."""
        from zoo.arviz import reference_inference_data

        return reference_inference_data(self, data, var_names, seed, progress)

    def diagnostics(self, x: torch.Tensor | None = None) -> dict[str, float]:
        """Convergence in numbers: divergences, ``lp``'s R-hat and bulk ESS, and with inputs
        ``x`` the worst R-hat and ESS of the network outputs on them (function space, which
        hidden-unit permutations do not scramble as they do raw weights)."""
        from zoo.arviz import chain_diagnostics

        quantities = {"lp": self.stats["lp"]}
        if x is not None:
            c, d = self.shape
            out = self.predict(x, progress=False).outputs
            quantities["outputs"] = out.reshape(c, d, *out.shape[1:])
        return {"divergences": self.divergences, **chain_diagnostics(quantities)}

    def save(self, path: str | os.PathLike) -> os.PathLike:
        """Write the reference (atomically) as plain data; ``zoo.load(path)`` reads it back
        without unpickling code (``model=`` for a network that is not a ``zoo.models``
        class)."""
        return files.atomic_save(
            {
                "format": files.FORMAT,
                "version": files.VERSION,
                "kind": "reference",
                "model": stored.model_payload(self.model),
                "draws": {k: v.cpu() for k, v in self.draws.items()},
                "stats": {k: v.cpu() for k, v in self.stats.items()},
                "wall_time": float(self.wall_time),
                "options": files.plain_data(self.options),
            },
            path,
        )


def reference_from_payload(payload: dict, model=None, map_location="cpu") -> Reference:
    """The :class:`Reference` a saved payload holds (see :meth:`Reference.save`)."""
    model = stored.restore_model(payload["model"], model)
    shapes = getattr(model, "site_shapes", {})
    wrong = {
        k: (tuple(v.shape[2:]), tuple(shapes[k]))
        for k, v in payload["draws"].items()
        if k in shapes and tuple(v.shape[2:]) != tuple(shapes[k])
    }
    if wrong:
        raise ValueError(f"the model's sites differ from the saved draws' (saved, model): {wrong}")
    if isinstance(model, torch.nn.Module):  # the draws' precision (a spec records no dtype)
        model.to(map_location, dtype=next(iter(payload["draws"].values())).dtype)
    return Reference(
        model=model,
        draws={k: v.to(map_location) for k, v in payload["draws"].items()},
        stats=dict(payload["stats"]),
        wall_time=payload["wall_time"],
        options=dict(payload["options"]),
        device=torch.device(map_location),
    )
