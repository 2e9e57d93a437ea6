"""A posterior given by weight draws made anywhere (:func:`from_draws`: NumPyro, an SG-MCMC
run, a loop of one's own), and what every posterior of stored draws shares
(:class:`DrawnPosterior`, which the HMC reference is too)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from zoo.arguments import check_bool, check_positive
from zoo.models.predictions import PredictionT
from zoo.results import blocks
from zoo.results.posterior import Posterior
from zoo.storage import checks as file_checks
from zoo.storage import files, model_form

__all__ = ["MANY_DRAWS", "Draws", "DrawnPosterior", "from_draws"]

#: Draws past which a posterior of stored draws warns when a call uses all of them by default.
MANY_DRAWS = 10_000


class DrawnPosterior(Posterior[PredictionT]):
    """A posterior held as ``C`` chains of ``D`` weight draws, ``draws = {site: (C, D,
    *site_shape)}``: it predicts with every draw unless ``num_samples`` asks for fewer
    (evenly spaced over the chains, so each contributes); ``seed`` fixes only what is drawn
    from the predictive (the draws are what they are)."""

    DEFAULT_SAMPLES = None
    ARVIZ_SAMPLES = None

    draws: dict

    @property
    def shape(self) -> tuple[int, int]:
        """``(chains, draws per chain)``."""
        return tuple(next(iter(self.draws.values())).shape[:2])

    def flat_draws(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """``{site: (S, *shape)}``: every chain's draws in chain order, or ``num_samples`` of
        them evenly spaced over that order (so every chain contributes). Every draw of more
        than :data:`MANY_DRAWS` taken by default warns: each is one network to evaluate."""
        check_positive(num_samples=num_samples)
        flat = self._every(num_samples)
        index = _spaced(next(iter(flat.values())).shape[0], num_samples)
        if index is None:
            return flat
        return {k: v[index.to(v.device)] for k, v in flat.items()}

    def _every(self, num_samples: int | None) -> dict[str, torch.Tensor]:
        """Every draw in chain order, as views; a warning when the call takes more than
        :data:`MANY_DRAWS` of them by default."""
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in self.draws.items()}
        total = next(iter(flat.values())).shape[0]
        self._warn_past(num_samples)
        if num_samples is None and total > MANY_DRAWS:
            warnings.warn(
                f"using all {total:,} draws (num_samples=None), one network each: pass "
                "num_samples= to use fewer, evenly spaced over the chains",
                stacklevel=4,
            )
        return flat

    def _warn_past(self, num_samples: int | None) -> None:
        """Warn, with the numbers, when ``num_samples`` asks for more draws than are held."""
        c, d = self.shape
        if num_samples is not None and num_samples > c * d:
            warnings.warn(
                f"num_samples={num_samples:,} asks for more draws than this "
                f"{type(self).__name__} holds ({c * d:,}: {c} chain(s) of {d}); using all "
                f"{c * d:,}. Pass num_samples={c * d:,} or fewer (None: every draw)",
                stacklevel=4,
            )

    def sample(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (S, *shape)}``: :meth:`flat_draws` (``seed`` is accepted for the common
        signature; stored draws are not drawn again)."""
        return self.flat_draws(num_samples)

    def draw_blocks(self, num_samples: int | None, seed: int | None) -> Iterator[dict]:
        """:meth:`flat_draws` block by block (:mod:`zoo.results.blocks`): views of the stored
        draws, or the evenly spaced selection copied one block at a time."""
        check_positive(num_samples=num_samples)
        every = self._every(num_samples)
        per = blocks.held_per_block(every)
        index = _spaced(next(iter(every.values())).shape[0], num_samples)
        if index is None:
            yield from blocks.sliced(every, per)
            return
        for start in range(0, len(index), per):
            chosen = index[start : start + per]
            yield {k: v[chosen.to(v.device)] for k, v in every.items()}

    def chains(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (C, D', *shape)}``: every draw, or ``ceil(num_samples / C)`` evenly spaced
        draws of each chain."""
        check_positive(num_samples=num_samples)
        c, d = self.shape
        self._warn_past(num_samples)
        if num_samples is None or num_samples >= c * d:
            return dict(self.draws)
        index = torch.linspace(0, d - 1, math.ceil(num_samples / c)).round().long()
        return {k: v[:, index.to(v.device)] for k, v in self.draws.items()}


def _spaced(total: int, num_samples: int | None) -> torch.Tensor | None:
    """Indices of ``num_samples`` of ``total`` draws evenly spaced over them, or ``None`` for
    every draw."""
    if num_samples is None or num_samples >= total:
        return None
    return torch.linspace(0, total - 1, num_samples).round().long()


@dataclass(repr=False)
class Draws(DrawnPosterior[PredictionT], kind="draws"):
    """Weight draws of a model made elsewhere, as a :class:`zoo.Posterior` (made by
    :func:`from_draws`).

    Attributes
    ----------
    model
        The model the draws are of (on ``device``).
    draws : dict of Tensor
        ``{site: (C, D, *site_shape)}``, every latent site of the model, constrained space.
    options : dict
        Plain data about the draws (``"label"``: what made them).
    wall_time : float
        Seconds it took to make them, as the caller said (0 when not given).
    device : torch.device
    """

    model: Any
    draws: dict[str, torch.Tensor]
    options: dict = field(default_factory=dict)
    wall_time: float = 0.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Posterior:
        """:func:`draws_from_payload` (``zoo.load``'s reader of this kind)."""
        return draws_from_payload(payload, path, model, map_location)

    def __repr__(self) -> str:
        c, d = self.shape
        label = self.options.get("label", "draws")
        return f"Draws({label!r}, model={type(self.model).__name__}, chains={c}, draws={d})"

    def describe(self) -> dict:
        """What made the draws (``options["label"]``)."""
        return {"inference": str(self.options.get("label", "draws given to zoo.from_draws"))}

    def payload(self) -> dict:
        """The model's spec and buffers, the draws, the options and the time."""
        return {
            "model": model_form.model_payload(self.model),
            "draws": {k: v.detach().cpu() for k, v in self.draws.items()},
            "options": files.plain_data(self.options),
            "wall_time": float(self.wall_time),
        }


def from_draws(
    model: Callable,
    draws: Mapping,
    *,
    chains: bool = False,
    label: str = "draws",
    wall_time: float = 0.0,
) -> Draws:
    """A :class:`zoo.Posterior` of weight draws of ``model``'s sites made by any sampler.

    Parameters
    ----------
    model : zoo model
        The model the draws are of (``zoo.models.*`` or ``zoo.models.from_module``); its
        likelihood scores the predictions. The draws go to its device.
    draws : mapping of str to array
        One entry per latent site of the model (``model.site_shapes``, a learned noise
        included), in the constrained space (a noise is a standard deviation): ``(S,
        *site_shape)`` arrays (torch tensors, NumPy arrays or anything ``numpy.asarray``
        reads, such as JAX's), or ``(C, D, *site_shape)`` with ``chains=True``.
    chains : bool, default False
        The first two dimensions are chains and draws (ArviZ reports R-hat across them).
    label : str
        What made the draws, shown by :meth:`~zoo.Posterior.to_arviz` and ``compare``.
    wall_time : float
        Seconds the sampler took, if the caller wants them in a comparison.

    Notes
    -----
    Every site, shape, dtype and value is checked before the posterior is made: a missing or
    unknown site, a shape that is not the site's, draws of different counts, or a value that
    is not finite is refused with a ``ValueError`` naming the site. Floating draws of any
    precision (NumPy's default float64, float16) are converted to the model's dtype, as its
    network computes in it. Predictions use every draw unless ``num_samples`` asks for
    fewer; past :data:`MANY_DRAWS` draws, a call that uses them all by default warns.
    """
    check_bool(chains=chains)
    shapes = getattr(model, "site_shapes", None)
    if shapes is None:
        raise TypeError(
            f"from_draws needs a zoo model (zoo.models.*, zoo.models.from_module), got "
            f"{type(model).__name__}: its site_shapes say what the draws must hold"
        )
    if not isinstance(draws, Mapping) or not draws:
        raise TypeError(f"draws must be a non-empty mapping site -> array, got {type(draws)}")
    missing, unknown = set(shapes) - set(draws), set(draws) - set(shapes)
    if missing or unknown:
        raise ValueError(
            f"the draws must hold every latent site of the model and nothing else: missing "
            f"{sorted(missing)}, unknown {sorted(unknown)} (the model's sites: {sorted(shapes)})"
        )
    first = next(iter(getattr(model, "parameters", list)()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None else torch.get_default_dtype()
    lead = 2 if chains else 1
    tensors, counts = {}, set()
    for name, value in draws.items():
        t = _as_tensor(name, value)
        if tuple(t.shape[lead:]) != tuple(shapes[name]) or t.dim() < lead:
            layout = "(C, D, *site_shape)" if chains else "(S, *site_shape)"
            raise ValueError(
                f"draws[{name!r}] has shape {tuple(t.shape)}; a {layout} array of the site "
                f"{tuple(shapes[name])} is needed"
            )
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"draws[{name!r}] holds values that are not finite")
        counts.add(tuple(t.shape[:lead]))
        tensors[name] = (t if chains else t.unsqueeze(0)).to(device=device, dtype=dtype)
    if len(counts) > 1 or 0 in next(iter(counts)):
        raise ValueError(f"every site needs the same positive number of draws, got {counts}")
    return Draws(model, tensors, {"label": str(label)}, float(wall_time), device)


def _as_tensor(name: str, value) -> torch.Tensor:
    """A floating tensor of ``value`` (a tensor, or anything ``numpy.asarray`` reads)."""
    if not torch.is_tensor(value):
        try:
            value = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as err:
            raise TypeError(f"draws[{name!r}] is not an array ({err})") from None
    if not value.is_floating_point():
        raise TypeError(f"draws[{name!r}] must be floating-point, got {value.dtype}")
    return value.detach()


def draws_from_payload(payload: dict, path, model, map_location) -> Draws:
    """The :class:`Draws` of a file's ``payload``, checked before anything is built."""
    files.require(payload, ("model", "draws", "options", "wall_time"), path)
    file_checks.check_tensors(payload["draws"], path, "draws")
    model = restore_drawn_model(payload, path, model, map_location)
    return Draws(
        model,
        {k: v.to(map_location) for k, v in payload["draws"].items()},
        dict(payload["options"]),
        float(payload["wall_time"]),
        torch.device(map_location),
    )


def restore_drawn_model(payload: dict, path, model, map_location):
    """The model of a file of draws, its sites checked against the draws' shapes and put on
    ``map_location`` in the draws' precision (a spec records no dtype)."""
    try:
        model = model_form.restore_model(payload["model"], model)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    shapes = getattr(model, "site_shapes", {})
    draws = payload["draws"]
    if not draws or any(not torch.is_tensor(v) or v.dim() < 2 for v in draws.values()):
        raise ValueError(f"{path}: the draws are not (chains, draws, ...) tensors")
    wrong = {
        k: (tuple(v.shape[2:]), tuple(shapes.get(k, ())))
        for k, v in draws.items()
        if k not in shapes or tuple(v.shape[2:]) != tuple(shapes[k])
    }
    missing = sorted(set(shapes) - set(draws))
    counts = {tuple(v.shape[:2]) for v in draws.values()}
    if any(0 in count for count in counts):
        raise ValueError(f"{path}: the file holds no draws (draw counts {sorted(counts)})")
    if wrong or missing or len(counts) > 1:
        raise ValueError(
            f"{path}: the draws do not fit the model (site: (saved, model) {wrong}; missing "
            f"{missing}; draw counts {sorted(counts)})"
        )
    if isinstance(model, torch.nn.Module):
        model.to(map_location, dtype=next(iter(draws.values())).dtype)
    return model
