"""Diagonal Gaussian (Bayes by Backprop, Blundell et al. 2015).

Per site: ``w = loc + softplus(rho) * eps``, ``eps ~ N(0, I)``; ``2 n`` parameters. The emitted
distribution is :class:`~guides.gaussian.DiagonalNormal`, ``Normal(loc, scale).to_event(k)``
(an :class:`~torch.distributions.Independent`), so Pyro's own KL registrations apply and
``TraceMeanField_ELBO`` is exact against Normal priors. Its site module,
:class:`~guides.site.DiagonalSite`, also serves constrained sites of every family.
"""

from __future__ import annotations

from guides.base import PerSiteGuide
from guides.gaussian import DiagonalNormal
from guides.site import DiagonalSite

__all__ = ["AutoDiagonal", "DiagonalNormal", "DiagonalSite"]


class AutoDiagonal(PerSiteGuide, family="diagonal"):
    """Mean-field Gaussian guide (Bayes by Backprop): an independent Normal per weight.

    ``q(w) = prod_i N(w_i; m_i, s_i^2)`` with ``s_i = softplus(rho_i)`` (a standard deviation).

    Parameters
    ----------
    model : callable
        The Pyro model.
    init_scale : float, default 0.01
        Initial standard deviation of every weight.
    init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`.
    """

    site_class = DiagonalSite
