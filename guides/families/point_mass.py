"""Point mass (MAP) family: ``q(w) = delta(w - m)`` per site.

With a point mass the ELBO's terms for a site are its log prior at ``m`` and no entropy
(``log q = 0`` at the point; Pyro's ``AutoDelta`` convention), so maximising the ELBO over ``m``
is maximum a posteriori estimation for those sites:

    ELBO = E_q[log p(y | w)] + sum_map log p(m_s) + sum_other (E_q[log p(w_s)] + H[q_s]).

On its own the family is MAP training (weight decay ``|m|^2 / (2 s^2)`` from a ``N(0, s^2)``
prior). Mixed with a Gaussian family it is subnetwork inference: MAP for the point-mass sites, VI
for the rest, the rest's posterior conditional on the MAP values. The common "Bayesian last
layer" recipe (train a network, then make its last layer Bayesian) is one call::

    guide = guides.AutoMixed.last_layer(model, "lowrank", init_module=trained_net)
    fit = zoo.fit(model, guide, data)

A constrained site (a learned noise scale) is a point mass too, at ``biject_to(support)`` of an
unconstrained parameter, with ``log q = 0`` as in Pyro's ``AutoDelta``: MAP in the site's own
(constrained) coordinates.

``TraceMeanField_ELBO`` uses Pyro's ``KL(delta_m || p) = -log p(m)``; predictions repeat the
same network (no spread) unless other sites are random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pyro.distributions as dist
import torch
import torch.nn.functional as F

from guides.base import PerSiteGuide
from guides.site import SitePosterior, param


class PointMass(dist.Delta):
    """``Delta(v, event_dim=k)`` with the capabilities the estimators ask of a site: a point
    mass's layer output is exact under local reparameterisation and Flipout (no spread)."""

    supports_local_reparameterization = True
    supports_flipout = True

    def mean_value(self) -> torch.Tensor:
        """The point itself."""
        return self.v

    def sample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        """Copies of the point, detached (a view of the parameter would still require grad
        under ``torch.no_grad``)."""
        shape = torch.Size(sample_shape) + self.v.shape
        return self.v.detach().expand(shape).clone()

    def push_forward(self, transform: Callable[[torch.Tensor], torch.Tensor]) -> PointMass:
        """The point mass at ``transform(v)``: a constrained site's value without the inverse
        transform's round trip (which may miss ``v`` by a rounding error, where a ``Delta`` has
        density zero)."""
        return PointMass(transform(self.v), event_dim=self.event_dim)

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x v^T + bias``: a point mass's layer output has no noise."""
        return F.linear(x, self.v, bias)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        n = math.prod(self.event_shape)
        return self.v.new_zeros(self.batch_shape + (n, n))


class PointMassSite(SitePosterior):
    """Parameter ``loc``: the site's value."""

    #: No draw or noise: the weight is the parameter (its gradient counted with it).
    STEP_BYTES_PER_WEIGHT = 12

    family = "map"
    MEAN_PARAMETER = "loc"  # guides.pairs

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__(init_loc, init_scale)
        self.loc = param(init_loc.detach().clone())

    @classmethod
    def constrained_class(cls) -> type[SitePosterior]:
        """A constrained site of the point-mass family is a point mass too."""
        return cls

    def distribution(self) -> PointMass:
        return PointMass(self.loc, event_dim=self.loc.dim())


class AutoMAP(PerSiteGuide, family="map"):
    """Point-mass guide: maximum a posteriori values of every site (``n`` parameters each).

    Parameters
    ----------
    model : callable
        The Pyro model.
    init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide` (``init_scale`` is accepted and unused).

    Notes
    -----
    Use it with :class:`guides.AutoMixed` for subnetwork inference, e.g. a Bayesian last layer on
    a MAP body: ``AutoMixed(model, {"fc2.*": "lowrank", "*": "map"})``.
    """

    site_class = PointMassSite
    OBJECTIVE = "map"  # no entropy: -loss is the log joint at the point
