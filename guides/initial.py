"""A guide's initial means, site by site (:class:`Means`): given weights (``init_module``), a
callable ``init_loc_fn``, the means the model offers (``"auto"``: a converted trained
network's weights, ``model.initial_means()``), or PyTorch's default layer initialisation
(``"kaiming"``; the prior median for scalars and constrained sites)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from guides.site import fan_in, is_real, kaiming_uniform_like, prior_median

#: A site started at a trained network's weights ``w`` (``"auto"``) starts with the standard
#: deviation ``min(init_scale, TRAINED_RELATIVE_SCALE * rms(w))``: MOPED's ``delta |w|``
#: (Krishnan et al. 2020) per site, so that the noise of a layer of small weights (a wide
#: last layer's) does not drown them, and a deep network's noise summed over its layers does
#: not flatten the predictive; chosen by the ``relative`` part of
#: ``benchmarks/trained_network.py`` at ``91a332b``.
TRAINED_RELATIVE_SCALE = 0.01


class Means:
    """The initial means of ``guide``'s sites, read once per set-up: ``given`` (an
    ``init_module``'s state dict) first, then ``init_loc_fn`` (a callable, ``"auto"`` or
    ``"kaiming"``)."""

    def __init__(self, guide: Any, given: dict[str, torch.Tensor], init_loc_fn: str | Callable):
        self.guide, self.given, self.init_loc_fn = guide, given, init_loc_fn
        offer = getattr(guide.model, "initial_means", None)
        offered = offer() if init_loc_fn == "auto" and callable(offer) else None
        self.offered: dict[str, torch.Tensor] = offered or {}
        self._shapes: dict[str, torch.Size] | None = None

    def value(self, name: str, site: dict) -> torch.Tensor:
        """The initial (constrained) value of site ``name`` of the prototype trace."""
        value = site["value"].detach()
        if name in self.given:
            return self._given(name, value)
        if callable(self.init_loc_fn):
            return torch.as_tensor(self.init_loc_fn(site)).to(value).detach().clone()
        offered = self.offered.get(name)
        if offered is not None and offered.shape == value.shape:
            return self.guide.loc_for_mean(name, offered.to(value).detach().clone())
        fn = site["fn"]
        if value.dim() == 0 or not is_real(fn.support):
            return prior_median(fn, value)
        if self._shapes is None:
            trace = self.guide._prototype()
            self._shapes = {n: s["value"].shape for n, s in trace.iter_stochastic_nodes()}
        return kaiming_uniform_like(value.shape, fan_in(name, self._shapes), value)

    def scale(self, name: str, init_scale: float) -> float:
        """The initial standard deviation of site ``name``: ``init_scale``, or less at a
        trained network's small weights (:data:`TRAINED_RELATIVE_SCALE`)."""
        offered = self.offered.get(name) if not callable(self.init_loc_fn) else None
        if name in self.given or offered is None or offered.dim() == 0:
            return init_scale
        rms = float(offered.float().pow(2).mean().sqrt())
        return min(init_scale, TRAINED_RELATIVE_SCALE * rms) if rms > 0 else init_scale

    def _given(self, name: str, value: torch.Tensor) -> torch.Tensor:
        init = self.given[name].to(dtype=value.dtype, device=value.device)
        to_site = getattr(self.guide.model, "to_site", None)  # a padding row is not in the site
        if callable(to_site) and init.shape != value.shape:
            init = to_site(name, init)
        if init.shape != value.shape:
            raise ValueError(
                f"init_module's {name!r} has shape {tuple(init.shape)} but the model's "
                f"site has shape {tuple(value.shape)}"
            )
        return init.clone()
