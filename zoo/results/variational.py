"""A fitted variational posterior (:class:`FitResult`: the model, the guide, the history), and
reading one back from its file."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from pyro.infer.autoguide import AutoGuide

from zoo.arguments import is_number
from zoo.evaluation.predictive import fitted_guide_device
from zoo.models.predictions import PredictionT
from zoo.models.statistics import frozen_statistics
from zoo.results import blocks
from zoo.results.posterior import Posterior
from zoo.runtime.rng import seeded
from zoo.storage import checks as file_checks
from zoo.storage import files, guide_form, model_form


@dataclass(repr=False)
class FitResult(Posterior[PredictionT], kind="fit"):
    """A fitted model and guide with their training history: a :class:`zoo.Posterior` whose
    draws are the guide's.

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

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Posterior:
        """:func:`fit_from_payload` (``zoo.load``'s reader of this kind)."""
        return fit_from_payload(payload, path, model, map_location)

    def __repr__(self) -> str:
        """A few lines: family, model, steps, the last loss, time and device (not every loss)."""
        last = f"{self.losses[-1]:.6g}" if self.losses else "none"
        state = ", interrupted" if self.interrupted else ""
        skipped = f", {len(self.skipped_steps)} skipped" if self.skipped_steps else ""
        test = (self.options.get("lr_test") or {}).get("steps")
        after = f" after a rate test of {test}" if test else ""
        phase = self.options.get("map_start")
        if isinstance(phase, dict):  # zoo.training.map_start
            after = f" after a MAP phase of {phase['steps']}"
        start = self.options.get("start")
        after += f", {start} start" if start else ""
        return (
            f"FitResult(guide={self.options.get('guide', self.family)}, "
            f"model={type(self.model).__name__},\n"
            f"          steps={self.steps}{skipped}{after}{state}, final loss (-ELBO)={last},\n"
            f"          wall_time={self.wall_time:.1f} s, device={self.device})"
        )

    @property
    def steps(self) -> int:
        """Optimiser updates taken."""
        return len(self.losses)

    def fitting(self) -> dict:
        """See :meth:`zoo.Posterior.fitting`: from ``options`` (a fit saved before the rule was
        recorded says ``"unknown"``)."""
        return fitting_of(self.options, self.steps)

    @property
    def family(self) -> str:
        """The guide's class name."""
        return getattr(type(self.guide), "__name__", "guide")

    @property
    def final_elbo(self) -> float:
        """The mean ELBO of the last completed epoch (of the last step when no epoch
        completed), on the full-data scale; NaN before any step."""
        last = self.epoch_losses or self.losses
        return -last[-1] if last else float("nan")

    @property
    def objective(self) -> str:
        """What the fit's ELBO bounds, as its guide declares it (``guide.objective()``; a
        guide of another library's: ``"model"``)."""
        declared = getattr(self.guide, "objective", None)
        return declared() if callable(declared) else "model"

    def num_variational_parameters(self) -> int:
        """The guide's parameters (:meth:`guides.PerSiteGuide.num_variational_parameters`)."""
        return self.guide.num_variational_parameters()

    def sample(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (S, *site_shape)}``: ``S`` draws of the fitted guide
        (``guide.sample_posterior``), seeded by ``seed`` without touching the caller's
        random state (``None``: the global generators): the blocks of :meth:`draw_blocks`
        side by side."""
        parts = list(self.draw_blocks(num_samples, seed))
        if len(parts) == 1:
            return parts[0]
        return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}

    def draw_blocks(self, num_samples: int | None, seed: int | None) -> Iterator[dict]:
        """The guide's draws made block by block (:mod:`zoo.results.blocks`): block ``j``
        of ``draws_per_block`` draws seeded ``block_seed(seed, j)``, so that only one block's
        weights are held at a time."""
        num_samples = self.sample_size(num_samples, seed)
        device = fitted_guide_device(self.guide)
        per = blocks.draws_per_block(guide_draw_bytes(self.guide))
        for j, size in enumerate(blocks.block_sizes(num_samples, per)):
            with torch.no_grad(), frozen_statistics(), seeded(blocks.block_seed(seed, j), device):
                block = self.guide.sample_posterior(size)
            yield block

    def describe(self) -> dict:
        """The family, the steps and the final ELBO."""
        return {"guide": self.family, "steps": self.steps, "final_elbo": self.final_elbo}

    def payload(self) -> dict:
        """The fit as plain data: the guide's family, options and parameters, the model's spec
        and buffers, the history and the options (an ensemble's file holds one per member)."""
        return {
            "guide": guide_form.guide_payload(self.guide),
            "model": model_form.model_payload(self.model),
            "history": {
                "losses": torch.tensor(self.losses, dtype=torch.float64),
                "epoch_losses": torch.tensor(self.epoch_losses, dtype=torch.float64),
                "skipped_steps": torch.tensor(self.skipped_steps, dtype=torch.int64),
                "wall_time": float(self.wall_time),
            },
            "options": files.plain_data(self.options),
        }


def guide_draw_bytes(guide: AutoGuide) -> int:
    """Bytes of one joint draw of a fitted guide's latent sites (from its prototype trace)."""
    trace = guide.prototype_trace
    if trace is None:  # a guide that was never run has no sites to measure: one block
        return 1
    values = [site["value"] for _, site in trace.iter_stochastic_nodes()]
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def fit_from_payload(payload: dict, path, model: Callable | None, map_location) -> FitResult:
    """The fit of a file's ``payload`` (read by :func:`zoo.storage.files.read`), checked
    before anything is built from it; ``path`` names the file in errors."""
    if payload.get("version", 1) < 2:
        return _load_v1(payload, model, map_location)
    check_fit_payload(payload, path)
    try:
        model = model_form.restore_model(payload["model"], model)
        if isinstance(model, torch.nn.Module):
            model.to("cpu")
        guide = guide_form.build_guide(model, payload["guide"])
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
    is built from it (:func:`zoo.storage.guide_form.check_guide_payload`)."""
    files.require(payload, ("guide", "model", "history", "options"), path)
    guide_form.check_guide_payload(payload["guide"], path)
    model = payload["model"]
    if not isinstance(model, dict) or "spec" not in model or "state" not in model:
        raise ValueError(f"{path}: the model entry has no spec or state (the file was changed)")
    file_checks.check_tensors(model["state"], path, "model state", floating=False)
    history = payload["history"]
    if not isinstance(history, dict):
        raise ValueError(f"{path}: the history entry is not a mapping (the file was changed)")
    files.require(
        history, ("losses", "epoch_losses", "skipped_steps", "wall_time"), path, "history"
    )
    for key, floating in (("losses", True), ("epoch_losses", True), ("skipped_steps", False)):
        value = history[key]
        ok = torch.is_tensor(value) and value.dim() == 1
        if not ok or value.is_floating_point() != floating:
            kind = "floating-point" if floating else "integer"
            raise ValueError(f"{path}: history[{key!r}] is not a 1-D {kind} tensor")
    if not is_number(history["wall_time"]) or not history["wall_time"] >= 0:
        raise ValueError(f"{path}: history['wall_time'] is {history['wall_time']!r}, not seconds")
    if not isinstance(payload["options"], dict):
        raise ValueError(f"{path}: the options entry is not a mapping (the file was changed)")


def _load_v1(payload: dict, model, map_location) -> FitResult:
    """A version-1 (pickled) fit, converted on unpickling to today's objects."""
    model = payload["model"] if model is None else model
    if isinstance(model, torch.nn.Module):
        model.to(map_location)
    guide = payload["guide"]
    guide.to(map_location)
    guide_form.attach(guide, model)
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


def fitting_of(options: dict, steps: int) -> dict:
    """:meth:`FitResult.fitting` from a fit's ``options`` and its ``steps`` (the rate test's
    added)."""
    test = options.get("lr_test") or {}
    rule = options.get("lr_rule", "unknown")
    if test:
        rule = f"range test ({test.get('steps', 0)} steps)"
    phase = options.get("map_start")
    if isinstance(phase, dict):  # the MAP phase's steps are the fit's (zoo.training.map_start)
        steps, rule = int(steps) + int(phase["steps"]), f"MAP start ({phase['steps']} steps)"
    lr = options.get("lr")
    return {
        "steps": int(steps) + int(test.get("steps", 0)),
        "lr": float(lr) if isinstance(lr, (int, float)) else math.nan,
        "lr_rule": rule,
    }
