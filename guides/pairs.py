"""What an optimiser may read of a posterior: each site's mean and, where one exists, its scale.

An optimiser that treats a weight's mean and its uncertainty together (a natural-gradient one
such as VOGN or IVON, a learning rate of its own for the variances) needs to know which
parameter holds a site's mean and which its standard deviation. :func:`mean_scale_pairs` says,
one :class:`MeanScale` per latent site whose family states one:

- ``mean`` is the parameter that *is* the site's posterior mean (``E_q[w] = mean``, shaped like
  the site; for a constrained site, such as a learned noise scale, the mean in its
  unconstrained space);
- ``raw_scale``, where the posterior is a diagonal Gaussian, is the parameter ``rho`` whose
  ``softplus(rho)`` is each weight's marginal standard deviation (not a variance), shaped like
  ``mean``; ``None`` where the family has no per-weight scale (the point mass) or its
  covariance is structured (low rank, block diagonal, tridiagonal, matrix normal: the mean
  alone is stated).

A family states its pairs through two class attributes of its site module
(:class:`guides.site.SitePosterior`): ``MEAN_PARAMETER`` and ``SCALE_PARAMETER``, the names of
its Pyro parameters. A family whose mean is no single parameter (WHVI's ``W = S1 H G H S2``,
MC dropout's ``(1 - p) M``) states none. Both tensors are the very leaves an optimiser's
parameter groups hold, so ``.grad`` after a backward is the gradient of the loss with respect
to them; :meth:`MeanScale.std_grad` turns the raw scale's into the gradient with respect to the
standard deviation.

``zoo.fit`` hands the pairs to an optimiser class whose constructor takes a ``pairs`` keyword
(``zoo.Optim(optimizer=MyNaturalGradient)``); its parameter groups also carry the parameters'
names (``param_groups[i]["param_names"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from guides.base import PerSiteGuide
from guides.site import inverse_softplus

__all__ = ["MeanScale", "mean_scale_pairs"]


@dataclass(frozen=True, eq=False)
class MeanScale:
    """One site's mean parameter and, for a diagonal Gaussian, its raw scale parameter.

    Attributes
    ----------
    site : str
        The sample site's name.
    mean : Tensor
        The leaf parameter equal to the site's posterior mean, shaped like the site.
    raw_scale : Tensor or None
        The leaf ``rho`` with ``softplus(rho)`` the marginal standard deviation of each weight,
        shaped like ``mean``; ``None`` where the family states no per-weight scale.
    """

    site: str
    mean: torch.Tensor
    raw_scale: torch.Tensor | None = None

    def _raw(self) -> torch.Tensor:
        if self.raw_scale is None:
            raise ValueError(f"site {self.site!r}: its family states a mean and no scale")
        return self.raw_scale

    def std(self) -> torch.Tensor:
        """Each weight's marginal standard deviation, ``softplus(rho)`` (detached)."""
        return F.softplus(self._raw().detach())

    def std_grad(self) -> torch.Tensor | None:
        """``dL / d std`` from ``rho``'s gradient (``d softplus(rho) / d rho = sigmoid(rho)``),
        or ``None`` before a backward has filled ``rho.grad``."""
        raw = self._raw()
        if raw.grad is None:
            return None
        return raw.grad / torch.sigmoid(raw.detach())

    @torch.no_grad()
    def set_std(self, std: torch.Tensor) -> None:
        """Write the standard deviations ``std`` (positive, shaped like ``mean``) into ``rho``
        in place (``rho = softplus^{-1}(std)``)."""
        raw = self._raw()
        std = torch.as_tensor(std, dtype=raw.dtype, device=raw.device)
        if std.shape != raw.shape or not bool((std > 0).all()):
            raise ValueError(
                f"site {self.site!r}: set_std takes positive values shaped {tuple(raw.shape)}, "
                f"got shape {tuple(std.shape)}"
            )
        raw.copy_(inverse_softplus(std))


def mean_scale_pairs(guide: Any) -> list[MeanScale]:
    """The :class:`MeanScale` of every latent site of a ``guides`` family whose site module
    states one, in the guide's site order (run the guide once first: ``zoo.fit`` does). A guide
    that is not a ``guides`` family (Pyro's own autoguides) states none: ``[]``."""
    if not isinstance(guide, PerSiteGuide) or guide.prototype_trace is None:
        return []
    pairs = []
    for name in guide.site_names:
        pair = _pair(name, guide.site_posterior(name))
        if pair is not None:
            pairs.append(pair)
    return pairs


def _pair(name: str, site) -> MeanScale | None:
    mean_name = getattr(site, "MEAN_PARAMETER", None)
    if mean_name is None:
        return None
    scale_name = getattr(site, "SCALE_PARAMETER", None)
    mean = getattr(site, f"{mean_name}_unconstrained")
    scale = None if scale_name is None else getattr(site, f"{scale_name}_unconstrained")
    return MeanScale(name, mean, scale)
