"""A fitted model and guide with their history (:class:`FitResult`), and reading one back."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from pyro.infer.autoguide import AutoGuide

from zoo.evaluation.scoring import evaluate
from zoo.models import stored
from zoo.runtime import file_checks, files
from zoo.runtime.serial import one_at_a_time

if TYPE_CHECKING:
    from zoo.mcmc.result import Reference


@dataclass
class CallbackView:
    """What a callback sees after every step. Return ``True`` from the callback to stop."""

    step: int
    epoch: int
    loss: float
    epoch_end: bool
    result: FitResult


@dataclass
class FitResult:
    """A fitted model and guide with their training history.

    Attributes
    ----------
    model, guide
        The model and the fitted guide (on ``device``).
    losses : list of float
        ``-ELBO`` estimate per step, on the full-data scale (see ``zoo.inference.elbo``).
    epoch_losses : list of float
        Mean of ``losses`` over each completed epoch.
    wall_time : float
        Seconds spent in the training loop.
    device : torch.device
        Where the model and guide are.
    options : dict
        The fit's settings (family, steps, batch size, learning rate, ...).
    interrupted : bool
        The fit was stopped by Ctrl-C.
    skipped_steps : list of int
        Steps skipped for a non-finite loss or gradient (``on_divergence="skip"``).
    """

    model: Callable
    guide: AutoGuide
    losses: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    options: dict = field(default_factory=dict)
    interrupted: bool = False
    skipped_steps: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        """A few lines: family, model, steps, the last loss, time and device (not every loss)."""
        last = f"{self.losses[-1]:.6g}" if self.losses else "none"
        state = ", interrupted" if self.interrupted else ""
        skipped = f", {len(self.skipped_steps)} skipped" if self.skipped_steps else ""
        return (
            f"FitResult(guide={self.options.get('guide', self.family)}, "
            f"model={type(self.model).__name__},\n"
            f"          steps={self.steps}{skipped}{state}, final loss (-ELBO)={last},\n"
            f"          wall_time={self.wall_time:.1f} s, device={self.device})"
        )

    @property
    def steps(self) -> int:
        """Optimiser updates taken."""
        return len(self.losses)

    @property
    def family(self) -> str:
        """The guide's class name."""
        return getattr(type(self.guide), "__name__", "guide")

    def predict(
        self,
        x: torch.Tensor,
        num_samples: int = 100,
        batch_size: int | None = None,
        progress: bool = True,
        sample_batch_size: int | None = None,
        seed: int | None = 0,
        distributed: bool = False,
        threads: int | str | None = "auto",
    ):
        """Posterior predictive on ``x`` from ``num_samples`` sampled networks, evaluated in
        blocks of inputs (see :func:`zoo.evaluation.predictive.predict`: the same options; its
        progress bar appears after two seconds). ``seed`` (default 0, as ``evaluate``'s and
        ``to_arviz``'s) fixes the draws, the caller's random state untouched; ``None`` draws
        from the global generator. ``distributed=True`` on every rank of a distributed
        run shards ``x`` across the ranks and gathers the outputs once. ``threads`` follows
        ``zoo.fit``'s rule (:mod:`zoo.runtime.threads`), the caller's setting restored after."""
        from zoo.evaluation.predictive import predict

        return predict(
            self.model,
            self.guide,
            x,
            num_samples=num_samples,
            batch_size=batch_size,
            sample_batch_size=sample_batch_size,
            progress=progress,
            seed=seed,
            distributed=distributed,
            threads=threads,
        )

    def save(self, path: str | os.PathLike) -> os.PathLike:
        """Write the fit to ``path`` (atomically) as plain data: the guide's family, options and
        parameters, the model's spec and buffers, and the history. ``zoo.load(path)`` reads it
        without unpickling code; a model that is not a ``zoo.models`` class is passed again as
        ``zoo.load(path, model=...)``."""
        return files.atomic_save(
            {"format": files.FORMAT, "version": files.VERSION, "kind": "fit", **self.payload()},
            path,
        )

    def payload(self) -> dict:
        """The fit as plain data (what :meth:`save` writes beside the file's format entries;
        an ensemble's file holds one per member)."""
        return {
            "guide": stored.guide_payload(self.guide),
            "model": stored.model_payload(self.model),
            "history": {
                "losses": torch.tensor(self.losses, dtype=torch.float64),
                "epoch_losses": torch.tensor(self.epoch_losses, dtype=torch.float64),
                "skipped_steps": torch.tensor(self.skipped_steps, dtype=torch.int64),
                "wall_time": float(self.wall_time),
            },
            "options": files.plain_data(self.options),
        }

    def to_arviz(
        self,
        data=None,
        num_samples: int = 200,
        var_names=None,
        seed: int | None = 0,
        progress: bool = True,
        distributed: bool = False,
        threads: int | str | None = "auto",
    ):
        """ArviZ ``InferenceData`` of this fit; see :func:`zoo.arviz.to_inference_data`."""
        from zoo.arviz import to_inference_data

        return to_inference_data(
            self,
            data,
            num_samples=num_samples,
            var_names=var_names,
            seed=seed,
            progress=progress,
            distributed=distributed,
            threads=threads,
        )

    def evaluate(
        self,
        data,
        num_samples: int = 100,
        batch_size: int | None = None,
        seed: int | None = 0,
        progress: bool = True,
        distributed: bool = False,
        threads: int | str | None = "auto",
    ) -> dict[str, float]:
        """Metrics on held-out ``data`` (``(X, y)``, a ``Dataset`` or a ``DataLoader``), as the
        model's likelihood defines them (``zoo.models.likelihoods``).

        Classification: ``accuracy``, ``nll`` (mean negative log predictive probability),
        ``brier``, ``ece`` (15 bins). Regression: ``rmse``, ``nll`` (mean negative log
        predictive *density* of the sample mixture, in the units of ``y``: it can be negative),
        ``coverage_95`` (central 95% predictive interval). ``seed`` fixes the weight draws
        without changing the caller's random state (``None``: the global generator).
        ``distributed=True``, on every rank of a distributed run: each rank predicts its shard
        of ``data`` with rank 0's draws and the outputs are gathered once, so every rank
        returns the metrics one process computes with those draws. ``threads`` as in
        :meth:`predict`.
        """
        return evaluate(
            self,
            data,
            num_samples=num_samples,
            batch_size=batch_size,
            progress=progress,
            seed=seed,
            distributed=distributed,
            threads=threads,
        )


@one_at_a_time
def load(
    path: str | os.PathLike,
    model: Callable | None = None,
    map_location: str | torch.device = "cpu",
    allow_pickle: bool = False,
) -> FitResult | Reference:
    """Load a fit written by :meth:`FitResult.save` (or a reference written by
    :meth:`zoo.mcmc.result.Reference.save`, returned as that), on ``map_location`` (CPU by
    default).

    Parameters
    ----------
    path : path
        The file.
    model : callable, optional
        Attach the guide to this model instead of rebuilding the saved one (needed when the
        model is not a ``zoo.models`` class); its sample sites must have the names and shapes
        the guide was fitted to, else a ``ValueError`` says which differ.
    map_location : str or torch.device
        Where the model and guide go; a fit saved on CUDA loads on the CPU by default.
    allow_pickle : bool, default False
        Also open files written before version 2, which are pickled Python objects:
        unpickling runs code from the file, so pass ``True`` only for files you trust (then
        ``save`` again to rewrite them as plain data).
    """
    payload = files.read(path, ("fit", "reference"), map_location="cpu", allow_pickle=allow_pickle)
    return from_payload(payload, path, model, map_location)


def from_payload(
    payload: dict, path, model: Callable | None, map_location
) -> FitResult | Reference:
    """The fit or reference of a file's ``payload`` (read by :func:`zoo.runtime.files.read`),
    checked before anything is built from it; ``path`` names the file in errors."""
    if payload.get("kind") == "reference":
        from zoo.mcmc.result import reference_from_payload

        files.require(payload, ("model", "draws", "stats", "wall_time", "options"), path)
        file_checks.check_tensors(payload["draws"], path, "draws")
        file_checks.check_tensors(payload["stats"], path, "stats")
        return reference_from_payload(payload, model, map_location)
    if payload.get("version", 1) < 2:
        return _load_v1(payload, model, map_location)
    check_fit_payload(payload, path)
    try:
        model = stored.restore_model(payload["model"], model)
        if isinstance(model, torch.nn.Module):
            model.to("cpu")
        guide = stored.build_guide(model, payload["guide"])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if isinstance(model, torch.nn.Module):
        model.to(map_location)
    guide.to(map_location)
    history = payload["history"]
    return FitResult(
        model=model,
        guide=guide,
        losses=history["losses"].tolist(),
        epoch_losses=history["epoch_losses"].tolist(),
        skipped_steps=history["skipped_steps"].tolist(),
        wall_time=history["wall_time"],
        device=torch.device(map_location),
        options=dict(payload["options"]),
    )


def check_fit_payload(payload: dict, path) -> None:
    """Refuse a fit file whose entries, guide sizes or tensors no fit writes, before anything
    is built from it (:mod:`zoo.runtime.file_checks`)."""
    files.require(payload, ("guide", "model", "history", "options"), path)
    file_checks.check_guide_payload(payload["guide"], path)
    model = payload["model"]
    if not isinstance(model, dict) or "spec" not in model or "state" not in model:
        raise ValueError(f"{path}: the model entry has no spec or state (the file was changed)")
    file_checks.check_tensors(model["state"], path, "model state", floating=False)
    history = payload["history"]
    files.require(
        history, ("losses", "epoch_losses", "skipped_steps", "wall_time"), path, "history"
    )


def _load_v1(payload: dict, model, map_location) -> FitResult:
    """A version-1 (pickled) fit, converted on unpickling to today's objects."""
    model = payload["model"] if model is None else model
    if isinstance(model, torch.nn.Module):
        model.to(map_location)
    guide = payload["guide"]
    guide.to(map_location)
    stored.attach(guide, model)
    return FitResult(
        model=model,
        guide=guide,
        losses=list(payload["losses"]),
        epoch_losses=list(payload["epoch_losses"]),
        skipped_steps=list(payload.get("skipped_steps", [])),
        wall_time=payload["wall_time"],
        device=torch.device(map_location),
        options=dict(payload["options"]),
    )
