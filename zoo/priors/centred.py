"""A prior centred on given weights: ``N(w, s^2)`` per weight, the empirical Bayes of MOPED
(Krishnan et al. 2020, bayesian-torch's ``moped_enable``) around a trained network.

Such a prior is *empirical Bayes*: its means were fitted to data, so when the network was
trained on the data the posterior is then fitted to, that data counts twice, and the ELBO
bounds the evidence of a model that has already seen them. It is the right prior for a
network trained on *other* data (transfer), and a pragmatic one that keeps a fine-tune close
to the trained network.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch import nn

from zoo.priors.fixed import Prior


class CentredNormalPrior(Prior):
    """``N(w_i, s_i^2)`` on every weight ``i``, centred on given weights ``w``.

    Parameters
    ----------
    weights : nn.Module or mapping of str to Tensor
        The centres: a network whose parameters are named like the model's sites
        (``fc.weight``, ...; the trained module given to ``from_module``), or
        ``{site: tensor}`` of the sites' shapes (``model.net_means()``).
    scale : float, default 0.1
        ``s``, the prior standard deviation of every weight (not a variance), when ``delta``
        is not given.
    delta : float, optional
        MOPED's relative scale: ``s_i = max(delta |w_i|, min_scale)``, a standard deviation
        proportional to each weight's size.
    min_scale : float, default 1e-4
        The least standard deviation with ``delta`` (a weight of zero gets this one).

    Notes
    -----
    Every site of the model that takes the prior needs a centre of its shape (checked when the
    model is built). In a mapping, a centre that names no site is refused too (a misspelt
    name would leave its site without the centre it was meant to have); a module's parameters
    that are no sites (batch norm's, a frozen layer's) are left out. The prior has a
    closed-form KL to every Gaussian family (``elbo="meanfield"``). It holds a copy of the
    weights (buffers that move with ``model.to``) and is not rebuilt from plain data:
    ``zoo.load`` of a fit under it needs ``model=``.
    """

    def __init__(
        self,
        weights: nn.Module | Mapping[str, torch.Tensor],
        scale: float = 0.1,
        delta: float | None = None,
        min_scale: float = 1e-4,
    ):
        super().__init__()
        for label, value in (("scale", scale), ("min_scale", min_scale), ("delta", delta)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{label} must be a positive number, got {value!r}")
        self._named = not isinstance(weights, nn.Module)  # every name a site, or refused
        if isinstance(weights, nn.Module):
            centres = {n: p.detach() for n, p in weights.named_parameters()}
        elif isinstance(weights, Mapping):
            centres = dict(weights)
        else:
            raise TypeError(
                "weights must be an nn.Module or a mapping site -> tensor, got "
                f"{type(weights).__name__}"
            )
        self._keys: dict[str, str] = {}  # site -> buffer name
        self.locs = nn.Module()  # buffers named by index: site names hold dots
        self.scales = nn.Module()
        for k, (name, w) in enumerate(centres.items()):
            if not torch.is_tensor(w) or not w.is_floating_point():
                raise TypeError(f"the centre of {name!r} must be a floating-point tensor")
            if not bool(torch.isfinite(w).all()):
                raise ValueError(f"the centre of {name!r} holds values that are not finite")
            w = w.detach().clone()
            s = (
                (delta * w.abs()).clamp_min(min_scale)
                if delta is not None
                else torch.full_like(w, float(scale))
            )
            self.locs.register_buffer(str(k), w)
            self.scales.register_buffer(str(k), s)
            self._keys[name] = str(k)
        self.delta = delta
        self.scale = float(scale)

    def bind(self, site_shapes: Mapping[str, torch.Size], fan_ins: Mapping[str, int]) -> None:
        missing = [n for n in site_shapes if n not in self._keys]
        named = getattr(self, "_named", False)  # a prior pickled before it: as then
        unknown = [n for n in self._keys if n not in site_shapes] if named else []
        if unknown:
            raise ValueError(
                f"CentredNormalPrior has centres {unknown} that name no site of the model (its "
                f"sites: {sorted(site_shapes)}): name each centre as its site, as "
                "model.net_means() does"
            )
        shapes = {n: self.locs.get_buffer(k).shape for n, k in self._keys.items()}
        wrong = {
            n: (tuple(shapes[n]), tuple(s))
            for n, s in site_shapes.items()
            if n in shapes and shapes[n] != s
        }
        if not (missing or wrong):
            for name in [n for n in self._keys if n not in site_shapes]:  # deterministic
                key = self._keys.pop(name)
                delattr(self.locs, key)
                delattr(self.scales, key)
            return
        raise ValueError(
            f"CentredNormalPrior needs a centre of each site's shape: missing {missing}, "
            f"shapes (centre, site) {wrong}; centre it on the module given to from_module, or "
            "on model.net_means() (a padding row is not part of a site)"
        )

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        raise TypeError("CentredNormalPrior is per site: site_distribution(name, ...)")

    def site_distribution(
        self, name: str, shape: torch.Size, fan_in: int, latent: Mapping[str, torch.Tensor]
    ) -> TorchDistribution:
        key = self._keys[name]
        loc, scale = self.locs.get_buffer(key), self.scales.get_buffer(key)
        return dist.Normal(loc, scale).to_event(loc.dim())

    def spec(self) -> dict | None:
        return None  # holds tensors: a fit under it loads with model=

    def extra_repr(self) -> str:
        rule = f"delta={self.delta:g}" if self.delta is not None else f"scale={self.scale:g}"
        return f"sites={len(self._keys)}, {rule}"
