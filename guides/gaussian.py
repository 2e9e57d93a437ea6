"""The Gaussian distributions that the posterior families emit, and their closed-form KL.

A weight tensor of shape ``event_shape`` (for example ``(out, in)`` or ``(out, in, kh, kw)``) is
flattened in row-major (C) order into a vector of length ``n``; every covariance in this package
is a covariance of that flattened vector. Each family implements four small pieces of algebra
(how standard noise maps to a deviation, the Mahalanobis norm, ``log det Cov`` and ``diag Cov``)
and gets ``rsample``, ``log_prob``, ``entropy``, ``variance`` and a KL divergence from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Independent, Normal, constraints
from torch.distributions.kl import register_kl

from guides.kernels import noise_squared_norm, squared_norm

_LOG_2PI = math.log(2 * math.pi)


def expand_to(x: torch.Tensor, batch_shape: torch.Size) -> torch.Tensor:
    """``x`` broadcast against ``batch_shape`` (free when the shapes already agree)."""
    if x.shape == batch_shape:
        return x
    return x.expand(torch.broadcast_shapes(x.shape, batch_shape))


def expanded(dist: Any, batch_shape: Sequence[int], instance: Any, cache: str) -> Any:
    """``dist.expand(batch_shape)`` for a distribution whose parameters broadcast over any batch
    shape: a shallow copy (``instance``, else a new object of its class) with the batch shape
    set and its cached draw or factor ``cache`` emptied; the parameters are shared."""
    new = dist.__class__.__new__(dist.__class__) if instance is None else instance
    new.__dict__.update(dist.__dict__)
    new._batch_shape = torch.Size(batch_shape)
    setattr(new, cache, None)
    return new


class GaussianMixin:
    """Moments shared by every family: flat views and a dense covariance for small sizes.

    Capabilities that ``zoo.inference.estimators`` asks of a site's distribution (a family states
    them here, nothing outside the family tests its type):

    ``supports_local_reparameterization``
        :meth:`local_linear` samples ``x W^T + bias`` per example from its exact distribution.
    ``supports_flipout``
        ``W - mean`` and ``(W - mean) * (r s^T)`` have the same distribution for random signs
        ``r, s``, so Flipout is exact.
    A closed-form KL is stated the torch way, by ``register_kl`` (see :func:`has_closed_form_kl`).
    """

    supports_local_reparameterization: bool = False
    supports_flipout: bool = False
    if TYPE_CHECKING:  # what the torch distribution it is mixed into holds

        @property
        def event_shape(self) -> torch.Size: ...

        @property
        def batch_shape(self) -> torch.Size: ...

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """A draw of ``x W^T + bias`` with independent noise per row of ``x``, ``W ~ self``."""
        raise NotImplementedError(f"{type(self).__name__} has no local reparameterisation")

    @property
    def num_elements(self) -> int:
        """``n``, a Python int (a traced graph holds it as a constant: a graph is built per
        shape, and size arithmetic would run on the host at every step)."""
        return math.prod(int(d) for d in self.event_shape)

    def log_det_covariance(self) -> torch.Tensor:
        """``log det Cov`` of the flattened ``n``-vector (a scalar)."""
        raise NotImplementedError

    def mean_value(self) -> torch.Tensor:
        """The mean tensor itself; ``log_prob`` of exactly this object skips the solve (its
        Mahalanobis norm is 0)."""
        raise NotImplementedError

    def variance_sum(self) -> torch.Tensor:
        """``tr Cov = sum_i Var[w_i]`` (a scalar): what the KL to an isotropic prior needs of
        the variances. By default the sum of the marginal variances; a family whose trace is
        cheaper than its ``n`` variances (the matrix normal's ``tr(A A^T) tr(B B^T)``) says so."""
        variance: torch.Tensor = self.variance  # type: ignore[attr-defined]  # the distribution's
        return variance.reshape(self.batch_shape + (-1,)).sum(-1)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """Dense ``(n, n)`` covariance in row-major order: for small sites and tests only."""
        cov = self._dense_covariance()
        return cov.expand(self.batch_shape + cov.shape)

    def _dense_covariance(self) -> torch.Tensor:
        raise NotImplementedError


class StructuredGaussian(GaussianMixin, TorchDistribution):
    """``N(loc, Cov)`` over a tensor of shape ``event_shape`` with a structured covariance.

    Subclasses hold their parameters unbatched (no leading dimensions); ``expand`` only changes
    ``batch_shape``, so one distribution can serve a plate of vectorised particles.

    Samples are ``loc + dev(eps)`` with ``eps`` standard normal of length ``noise_size``.
    ``log_prob`` of the value just drawn by ``rsample`` computes the Mahalanobis norm from ``eps``
    (``|eps|^2`` for a square factor ``Cov = L L^T``): the same function of the parameters as the
    exact formula, hence the same value and total derivative, without solving against ``Cov``.
    Any other value goes through the family's exact Mahalanobis norm.
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, loc: torch.Tensor, validate_args: bool | None = None):
        self.loc = loc
        self._flat_loc = loc.reshape(-1)
        self._cache: tuple[torch.Tensor, ...] | None = None  # (value, noise, ...) of the last draw
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    # ---- family algebra (flat, unbatched parameters; leading dims on the arguments) ----
    @property
    def noise_size(self) -> int:
        return self.num_elements

    def _deviation(self, eps: torch.Tensor) -> torch.Tensor:
        """Map noise ``(..., noise_size)`` to a deviation ``(..., n)`` with covariance ``Cov``
        (used by :meth:`rsample`; a family that overrides ``rsample`` need not define it)."""
        raise NotImplementedError

    def _mahalanobis(self, diff: torch.Tensor) -> torch.Tensor:
        """``diff^T Cov^{-1} diff`` for ``diff`` of shape ``(..., n)``."""
        raise NotImplementedError

    def _noise_mahalanobis(self, eps: torch.Tensor) -> torch.Tensor:
        """``diff^T Cov^{-1} diff`` for ``diff = _deviation(eps)``, as a function of the noise.

        With a square factor (``Cov = L L^T``, ``diff = L eps``) it is ``|eps|^2``; families whose
        noise is longer than the site override it.
        """
        return squared_norm(eps)

    def _flat_variance(self) -> torch.Tensor:
        raise NotImplementedError

    # ---- torch.distributions interface ----
    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self) -> torch.Tensor:
        return self.loc.expand(self.batch_shape + self.event_shape)

    @property
    def mode(self) -> torch.Tensor:
        return self.mean

    @property
    def variance(self) -> torch.Tensor:
        var = self._flat_variance().reshape(self.event_shape)
        return var.expand(self.batch_shape + self.event_shape)

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Any:
        return expanded(self, batch_shape, _instance, "_cache")

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape
        eps = torch.randn(shape + (self.noise_size,), dtype=self.loc.dtype, device=self.loc.device)
        value = (self._flat_loc + self._deviation(eps)).reshape(shape + self.event_shape)
        self._cache = (value, eps)
        return value

    def mean_value(self) -> torch.Tensor:
        return self.loc

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if value is self.loc:
            maha = torch.zeros((), dtype=value.dtype, device=value.device)
        elif self._cache is not None and value is self._cache[0]:
            maha = self._noise_mahalanobis(self._cache[1])
        else:
            k = len(self.event_shape)
            diff = value.reshape(value.shape[: value.dim() - k] + (-1,)) - self._flat_loc
            maha = self._mahalanobis(diff)
        # -(maha + log det Cov + n log(2 pi)) / 2, in two operations on the device
        c = -0.5 * self.num_elements * _LOG_2PI
        log_prob = torch.rsub(torch.add(maha, self.log_det_covariance()), c, alpha=0.5)
        return expand_to(log_prob, self.batch_shape)

    def entropy(self) -> torch.Tensor:
        n = self.num_elements
        h = 0.5 * (n * (1.0 + _LOG_2PI) + self.log_det_covariance())
        return h.expand(self.batch_shape)


class DiagonalNormal(GaussianMixin, dist.Independent):  # type: ignore[override]  # torch's stubs
    """``Normal(loc, scale).to_event(k)`` with the moments every family exposes (``scale`` is a
    standard deviation). Pyro's own KL registrations for ``Independent(Normal)`` apply."""

    supports_local_reparameterization = True
    supports_flipout = True

    def log_det_covariance(self) -> torch.Tensor:
        return 2 * self.base_dist.scale.log().sum()

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        base = self.base_dist
        shape = self._extended_shape(torch.Size(sample_shape))
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
            maha = noise_squared_norm(eps.reshape(eps.shape[: eps.dim() - k] + (-1,)))
        scale = self.base_dist.scale
        log_scale = scale.log().reshape(scale.shape[: scale.dim() - k] + (-1,)).sum(-1)
        # -n log(2 pi) / 2 - sum log scale - maha / 2, in two operations on the device
        c = -0.5 * self.num_elements * _LOG_2PI
        return torch.rsub(torch.add(log_scale, maha, alpha=0.5), c)

    def mean_value(self) -> torch.Tensor:
        return self.base_dist.loc

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``b_n ~ N(M x_n + bias, diag(S^2 x_n^2))`` with ``S`` the standard deviations."""
        mean = torch.nn.functional.linear(x, self.base_dist.loc, bias)
        var = torch.nn.functional.linear(x.pow(2), self.base_dist.scale.pow(2))
        return torch.addcmul(mean, var.clamp_min(1e-30).sqrt(), torch.randn_like(mean))

    def _dense_covariance(self) -> torch.Tensor:
        return torch.diag_embed(self.base_dist.scale.pow(2).reshape(-1))


def gaussian_kl(q, loc_p: torch.Tensor, scale_p: torch.Tensor, p_batch_shape=()) -> torch.Tensor:
    """``KL(q || N(loc_p, diag(scale_p^2)))`` for a Gaussian ``q`` of this package.

    With prior means ``mu`` and standard deviations ``s`` (any shape broadcastable to the site)::

        KL = 1/2 [ sum_i (Var_q[w_i] + (m_i - mu_i)^2) / s_i^2  - n + sum_i log s_i^2
                   - log det Cov_q ]

    which needs only the means, the marginal variances and ``log det Cov_q``: O(n) for every
    family. The result has the broadcast batch shape of ``q`` and the prior.
    """
    k = len(q.event_shape)
    if not q.batch_shape and _uniform(loc_p) and _uniform(scale_p):  # an isotropic prior
        return _isotropic_kl(q, loc_p, scale_p).expand(p_batch_shape)
    var_p = scale_p.pow(2)
    terms = (q.variance + (q.mean - loc_p).pow(2)) / var_p + var_p.log()
    terms = terms.expand(torch.broadcast_shapes(terms.shape, q.batch_shape + q.event_shape))
    total = terms.reshape(terms.shape[: terms.dim() - k] + (-1,)).sum(-1)
    kl = 0.5 * (total - q.num_elements - q.log_det_covariance())
    return kl.expand(torch.broadcast_shapes(kl.shape, q.batch_shape, p_batch_shape))


def _uniform(t: torch.Tensor) -> bool:
    """Whether ``t`` is one number seen at every position (a scalar, or expanded from one):
    read from its strides, never from its values."""
    return t.numel() == 1 or all(stride == 0 for stride in t.stride())


def _isotropic_kl(q, loc_p: torch.Tensor, scale_p: torch.Tensor) -> torch.Tensor:
    """:func:`gaussian_kl` to ``N(mu I, s^2 I)`` in two passes over the means
    (``||m - mu||^2 = ||m||^2 - 2 mu sum m + n mu^2``) and the family's trace
    (:meth:`GaussianMixin.variance_sum`), not the ``n``-element terms: the same number
    (``tests/guides/test_distributions.py`` checks it against the dense KL)."""
    n = q.num_elements
    mu, var_p = loc_p.reshape(-1)[0], scale_p.reshape(-1)[0].pow(2)
    m = q.mean.reshape(-1)
    distance = squared_norm(m) - 2 * mu * m.sum() + n * mu.pow(2)
    total = (q.variance_sum() + distance) / var_p + n * var_p.log()
    return 0.5 * (total - n - q.log_det_covariance())


def gaussian_kl_to_normal(q: GaussianMixin, p: Independent) -> torch.Tensor:
    """``KL(q || p)`` for ``p = Normal(loc, scale).to_event(k)`` over the same event shape."""
    base = p.base_dist
    k = len(q.event_shape)
    if not isinstance(base, Normal) or p.reinterpreted_batch_ndims != k:
        raise NotImplementedError
    if p.event_shape != q.event_shape:
        raise NotImplementedError
    return gaussian_kl(q, base.loc, base.scale, p.batch_shape)


@register_kl(StructuredGaussian, Independent)
def _kl_structured_independent(q, p):
    return gaussian_kl_to_normal(q, p)


def has_closed_form_kl(q, p) -> bool:
    """Whether ``KL(q || p)`` has a registered closed form for these two distributions."""
    try:
        torch.distributions.kl_divergence(q, p)
    except NotImplementedError:
        return False
    return True
