"""Diagonal Gaussian (Bayes by Backprop, Blundell et al. 2015).

Per site: ``w = loc + softplus(rho) * eps``, ``eps ~ N(0, I)``; ``2 n`` parameters. The emitted
distribution is ``Normal(loc, scale).to_event(k)`` (an :class:`~torch.distributions.Independent`),
so Pyro's own KL registrations apply and ``TraceMeanField_ELBO`` is exact against Normal priors.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroParam

from guides.base import PerSiteGuide, SitePosterior, inverse_softplus
from guides.gaussian import GaussianMixin, squared_norm


class DiagonalNormal(GaussianMixin, dist.Independent):
    """``Normal(loc, scale).to_event(k)`` with the moments every family exposes."""

    def log_det_covariance(self) -> torch.Tensor:
        return 2 * self.base_dist.scale.log().sum()

    def rsample(self, sample_shape=()) -> torch.Tensor:
        base = self.base_dist
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=base.loc.dtype, device=base.loc.device)
        value = torch.addcmul(base.loc, eps, base.scale)
        self._cache = (value, eps)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Exact; for the value just drawn by ``rsample`` it reuses ``eps`` (the same value and
        total derivative, without a backward pass through ``value``)."""
        cache = getattr(self, "_cache", None)
        k = self.reinterpreted_batch_ndims
        if value is self.base_dist.loc:  # the mean: Mahalanobis norm 0
            maha = torch.zeros((), dtype=value.dtype, device=value.device)
        elif cache is None or value is not cache[0]:
            return super().log_prob(value)
        else:
            eps = cache[1]
            maha = squared_norm(eps.reshape(eps.shape[: eps.dim() - k] + (-1,)))
        scale = self.base_dist.scale
        log_scale = scale.log().reshape(scale.shape[: scale.dim() - k] + (-1,)).sum(-1)
        n = self.num_elements
        return -0.5 * maha - log_scale - 0.5 * n * math.log(2 * math.pi)

    def mean_value(self) -> torch.Tensor:
        return self.base_dist.loc

    def _dense_covariance(self) -> torch.Tensor:
        return torch.diag_embed(self.base_dist.scale.pow(2).reshape(-1))


class DiagonalSite(SitePosterior):
    """Parameters ``loc`` and ``rho`` (softplus(rho) is the standard deviation)."""

    family = "diagonal"

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__(init_loc, init_scale)
        self.loc = PyroParam(init_loc.detach().clone())
        self.rho = PyroParam(torch.full_like(init_loc, float(inverse_softplus(init_scale))))

    def distribution(self) -> DiagonalNormal:
        base = dist.Normal(self.loc, F.softplus(self.rho))
        return DiagonalNormal(base, self.loc.dim())


class AutoDiagonal(PerSiteGuide):
    """Mean-field Gaussian guide (Bayes by Backprop): an independent Normal per weight.

    ``q(w) = prod_i N(w_i; m_i, s_i^2)`` with ``s_i = softplus(rho_i)`` (a standard deviation).

    Parameters
    ----------
    model : callable
        The Pyro model.
    init_scale : float, default 0.01
        Initial standard deviation of every weight.
    init_loc, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`.
    """

    site_class = DiagonalSite
