"""MC dropout as a variational family (Gal & Ghahramani 2016, "Dropout as a Bayesian
approximation"; Gal's thesis, section 3.2).

Dropout of a layer's inputs is a random mask over the columns of its weight. For a weight of
shape ``(out, in)`` (a convolution kernel ``(out, in, kh, kw)``: dropout over input channels),
with the variational parameter ``M`` shaped like the weight,

    W = M diag(z) + sigma E,    z_j ~ Bernoulli(1 - p),    E_ij ~ N(0, 1),

so column ``j`` (``K = out kh kw`` elements) is a mixture of two narrow Gaussians::

    q(W_:j) = (1 - p) N(M_:j, sigma^2 I) + p N(0, sigma^2 I).

``p`` (the dropout probability) and ``sigma`` are fixed; only ``M`` is learned. ``log_prob`` is the
exact density of the mixture (a log-sum-exp per column), so ``Trace_ELBO`` is well defined, and
``rsample`` is differentiable in ``M``. Moments: ``E[W] = (1 - p) M``,
``Var[W_ij] = p (1 - p) M_ij^2 + sigma^2`` (a standard deviation is its square root), zero
covariance between columns.

The KL to a Normal prior ``N(mu, s^2)`` (elementwise) is Gal's: with ``E_q`` exact and the
mixture's entropy taken for well separated components (``|M_:j| >> sigma``, the regime
``sigma -> 0`` that the construction is about),

    KL = sum_ij [((1 - p)(M_ij - mu_ij)^2 + p mu_ij^2 + sigma^2) / (2 s_ij^2) + log s_ij]
         - n log sigma - n / 2 - in H(p),      H(p) = -p log p - (1 - p) log(1 - p),

i.e. for a ``N(0, s^2)`` prior the L2 term ``(1 - p) |M|^2 / (2 s^2)`` of dropout's weight decay
plus a constant. The constant ``-n log sigma`` is large (the family is nearly degenerate), so an
MC dropout ELBO is far below a Gaussian family's by construction: compare predictive metrics
(NLL, accuracy, calibration), not ELBOs, across families. ``TraceMeanField_ELBO`` uses this KL;
``Trace_ELBO`` (the default) estimates it by Monte Carlo from the exact ``log_prob``.

Sites with fewer than two dimensions (biases, scalars) get the narrow Gaussian ``N(b, sigma^2)``
with the same fixed ``sigma``: Gal's point-estimated bias, whose KL to ``N(0, s^2)`` is the L2 term
``b^2 / (2 s^2)`` plus a constant.

Training draws one mask per example by default (the family's recipe: ``estimator="auto"``,
which is ``"local"`` on every linear and convolution layer the family serves; standard dropout
training: ``x W^T = (x * z) M^T`` plus the ``sigma`` noise for a linear layer, input channels
masked per example for a convolution; each example's output has exactly its distribution under
``q``). ``zoo.Loss(estimator="reparam")``, and several particles, draw one mask per step,
shared by the minibatch: an unbiased ELBO too, with far noisier gradients (a ResNet-8 learns
much slower under it; ``benchmarks/README.md`` at ``91a332b``). Predictions average the network over
weight draws, each with its own masks: MC dropout.

Relation to ``torch.nn.Dropout``, which divides the kept inputs by ``1 - p``: a network trained
with it computes ``(x * z) W_torch^T / (1 - p)``, which is this family with
``M = W_torch / (1 - p)``. To start from such a network, give ``init_module`` a copy whose
weights are divided by ``1 - p``. A converted network's own weights (``init_loc_fn="auto"``,
``zoo.models.from_module``) are taken as the mean network: ``M = W / (1 - p)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution
from torch.distributions import Independent, Normal, constraints
from torch.distributions.kl import register_kl

from guides.base import PerSiteGuide
from guides.checks import is_number
from guides.gaussian import DiagonalNormal, expand_to, expanded
from guides.kernels import squared_norm
from guides.registry import Recipe
from guides.site import SitePosterior, SiteSpec, param

_LOG_2PI = math.log(2 * math.pi)


class MCDropoutWeight(TorchDistribution):
    """Gal's dropout distribution over a weight of shape ``(out, in, ...)``: input columns
    (dimension 1) dropped with probability ``p``, every element blurred by ``N(0, sigma^2)``.

    Parameters
    ----------
    loc : Tensor
        ``M``, shape ``(out, in, ...)`` (two or more dimensions).
    p : float
        Dropout probability, in ``[0, 1)``.
    sigma : float
        Standard deviation of each mixture component (small).
    """

    arg_constraints: dict = {}
    has_rsample = True
    supports_local_reparameterization = True
    supports_local_conv = True
    supports_flipout = False

    def prefers_local(self, layer: str, rows: int) -> bool:
        """``estimator="auto"`` (the family's default) draws a mask per example on every
        linear and convolution layer, as dropout trains: its gradients are far less noisy
        than those of one mask shared by the minibatch, whatever the layer's size."""
        return True

    def __init__(
        self, loc: torch.Tensor, p: float, sigma: float, validate_args: bool | None = None
    ):
        if loc.dim() < 2:
            raise ValueError(f"MC dropout needs a weight of 2 or more dimensions, got {loc.shape}")
        check_dropout(p, sigma)
        self.loc, self.p, self.sigma = loc, float(p), float(sigma)
        self._cache: tuple | None = None
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    # ---- shapes ----
    @property
    def columns(self) -> int:
        """Number of dropped units (``in``)."""
        return self.event_shape[1]

    @property
    def num_elements(self) -> int:
        return math.prod(self.event_shape)

    def _mask_view(self, z: torch.Tensor) -> torch.Tensor:
        """Masks ``(..., in)`` -> ``(..., 1, in, 1, ...)``, broadcastable against the weight."""
        trailing = len(self.event_shape) - 2
        return z.reshape(z.shape[:-1] + (1, self.columns) + (1,) * trailing)

    def column_sums(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., out, in, ...)`` -> ``(..., in)``: sums over every event dimension but ``in``."""
        k = len(self.event_shape)
        dims = [-k] + list(range(-k + 2, 0))
        return x.sum(dims)

    # ---- torch.distributions interface ----
    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self) -> torch.Tensor:
        return ((1 - self.p) * self.loc).expand(self.batch_shape + self.event_shape)

    @property
    def variance(self) -> torch.Tensor:
        var = self.p * (1 - self.p) * self.loc.pow(2) + self.sigma**2
        return var.expand(self.batch_shape + self.event_shape)

    def mean_value(self) -> torch.Tensor:
        """``E[W] = (1 - p) M`` (what an estimator serves when it needs no draw)."""
        return self.mean

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Any:
        return expanded(self, batch_shape, _instance, "_cache")

    def sample_masks(self, shape: torch.Size) -> torch.Tensor:
        """Independent keep-masks ``z`` of shape ``shape + (in,)`` (1 keeps a column)."""
        keep = torch.full(
            tuple(shape) + (self.columns,), 1 - self.p, dtype=self.loc.dtype, device=self.loc.device
        )
        return torch.bernoulli(keep)

    def weight(self, masks: torch.Tensor, eps: torch.Tensor | None = None) -> torch.Tensor:
        """``M diag(z) + sigma eps`` for given keep-masks ``(..., in)`` (and noise; none: 0)."""
        value = self.loc * self._mask_view(masks)
        return value if eps is None else value + self.sigma * eps

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape
        masks = self.sample_masks(shape)
        eps = torch.randn(shape + self.event_shape, dtype=self.loc.dtype, device=self.loc.device)
        value = self.weight(masks, eps)
        self._cache = (value, masks)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Exact log density: ``sum_j logsumexp(log(1-p) + log N(W_:j; M_:j, sigma^2 I),
        log p + log N(W_:j; 0, sigma^2 I))``."""
        inv = 0.5 / self.sigma**2
        kept = math.log1p(-self.p) - inv * self.column_sums((value - self.loc).pow(2))
        dropped = (math.log(self.p) if self.p > 0 else -math.inf) - inv * self.column_sums(
            value.pow(2)
        )
        per_column = torch.logaddexp(kept, dropped)
        norm = self.num_elements * (math.log(self.sigma) + 0.5 * _LOG_2PI)
        return expand_to(per_column.sum(-1) - norm, self.batch_shape)

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``(x_n * z_n) M^T + bias + sigma |x_n| eps_n`` with a keep-mask ``z_n`` per example:
        the exact distribution of ``x_n W^T + bias`` under ``q``, independent across examples."""
        masks = torch.bernoulli(torch.full_like(x, 1 - self.p))
        out = F.linear(x * masks, self.loc, bias)
        norm = x.pow(2).sum(-1, keepdim=True).sqrt()
        return out + self.sigma * norm * torch.randn_like(out)

    def local_conv(self, func: Callable, arguments: dict) -> torch.Tensor:
        """A convolution ``func`` (``F.conv1d/2d/3d``, its bound ``arguments``) with an
        input-channel keep-mask per example: ``conv(x_n * z_n, M) + bias + conv(x_n, sigma E)``
        with one ``E`` for the batch. Each example's output has exactly its distribution under
        ``q`` (the examples share the small ``sigma`` blur, not the masks)."""
        x = arguments["input"]
        options = {k: v for k, v in arguments.items() if k not in ("input", "weight", "bias")}
        spatial = x.dim() - 2
        masks = self.sample_masks(x.shape[:1]).reshape(x.shape[:2] + (1,) * spatial)
        out = func(x * masks, self.loc, arguments["bias"], **options)
        blur = self.sigma * torch.randn_like(self.loc)
        return out + func(x, blur, None, **options)

    @torch.no_grad()
    def marginal_icdf(self, q: torch.Tensor) -> torch.Tensor:
        """Quantiles of each weight's marginal ``(1-p) N(M_ij, sigma^2) + p N(0, sigma^2)``, by
        bisection; ``q`` broadcasts against the weight (e.g. shape ``(Q, 1, 1)``)."""
        loc = self.loc
        unit = Normal(torch.zeros((), dtype=loc.dtype, device=loc.device), 1.0)
        q = torch.as_tensor(q, dtype=loc.dtype, device=loc.device)
        lo = (torch.minimum(loc, torch.zeros_like(loc)) - 10 * self.sigma).expand_as(q * loc)
        hi = (torch.maximum(loc, torch.zeros_like(loc)) + 10 * self.sigma).expand_as(q * loc)
        lo, hi = lo.clone(), hi.clone()
        for _ in range(60):
            mid = (lo + hi) / 2
            cdf = (1 - self.p) * unit.cdf((mid - loc) / self.sigma) + self.p * unit.cdf(
                mid / self.sigma
            )
            below = cdf < q
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return (lo + hi) / 2

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """Dense ``(n, n)`` covariance in row-major order: for small sites and tests only."""
        m = self.loc.reshape(-1)
        column = torch.arange(self.columns, device=m.device)
        column = self._mask_view(column).expand(self.event_shape).reshape(-1)
        same = (column[:, None] == column[None, :]).to(m.dtype)
        cov = self.p * (1 - self.p) * torch.outer(m, m) * same
        cov = cov + self.sigma**2 * torch.eye(len(m), dtype=m.dtype, device=m.device)
        return cov.expand(self.batch_shape + cov.shape)


def check_dropout(p: float, sigma: float, name: str = "p") -> None:
    """Refuse a dropout probability outside ``[0, 1)`` or a non-positive ``sigma``."""
    if not is_number(p) or not 0 <= p < 1:
        raise ValueError(f"the dropout probability {name} must lie in [0, 1), got {p!r}")
    if not is_number(sigma) or not sigma > 0:
        raise ValueError(f"sigma must be a positive number, got {sigma!r}")


def dropout_kl(
    q: MCDropoutWeight, loc_p: torch.Tensor, scale_p: torch.Tensor, p_batch_shape=()
) -> torch.Tensor:
    """Gal's ``KL(q || N(loc_p, diag(scale_p^2)))`` (see the module docstring): the expected log
    prior exactly, the mixture's entropy for well separated components. ``loc_p`` and
    ``scale_p`` (a standard deviation) broadcast against the weight."""
    k = len(q.event_shape)
    var_p = scale_p.pow(2)
    keep = 1 - q.p
    if loc_p.numel() == 1 and scale_p.numel() == 1:  # an isotropic prior: one pass over M
        n = q.num_elements
        sq = squared_norm((q.loc - loc_p.reshape(())).reshape(-1))
        const = n * (q.p * loc_p.pow(2) + q.sigma**2).reshape(())
        cross = 0.5 * ((keep * sq + const) / var_p.reshape(()) + n * var_p.log().reshape(()))
    else:
        second = (keep * (q.loc - loc_p).pow(2) + q.p * loc_p.pow(2) + q.sigma**2) / var_p
        terms = 0.5 * (second + var_p.log())
        terms = terms.expand(torch.broadcast_shapes(terms.shape, q.batch_shape + q.event_shape))
        cross = terms.reshape(terms.shape[: terms.dim() - k] + (-1,)).sum(-1)
    h_p = -sum(v * math.log(v) for v in (q.p, keep) if v > 0)
    kl = cross - q.num_elements * (math.log(q.sigma) + 0.5) - q.columns * h_p
    return kl.expand(torch.broadcast_shapes(kl.shape, q.batch_shape, p_batch_shape))


@register_kl(MCDropoutWeight, Independent)
def _kl_dropout_normal(q: MCDropoutWeight, prior: Independent) -> torch.Tensor:
    base = prior.base_dist
    if not isinstance(base, Normal) or prior.reinterpreted_batch_ndims != len(q.event_shape):
        raise NotImplementedError
    if prior.event_shape != q.event_shape:
        raise NotImplementedError
    return dropout_kl(q, base.loc, base.scale, prior.batch_shape)


class MCDropoutSite(SitePosterior):
    """Parameter ``loc`` (``M``); ``p`` and ``sigma`` are fixed options."""

    family = "mc_dropout"

    def __init__(
        self, init_loc: torch.Tensor, init_scale: float, p: float = 0.1, sigma: float = 1e-3
    ):
        super().__init__(init_loc, init_scale)
        check_dropout(p, sigma)
        self.p, self.sigma = float(p), float(sigma)
        self.loc = param(init_loc.detach().clone())
        # sigma on the parameters' device, made once: a tensor made from the Python number in
        # every step would be a copy from the host on a GPU (not saved: ``sigma`` is an option).
        self.register_buffer("sigma_tensor", init_loc.new_tensor(self.sigma), persistent=False)

    def distribution(self) -> MCDropoutWeight | DiagonalNormal:
        if self.loc.dim() >= 2:
            return MCDropoutWeight(self.loc, self.p, self.sigma)
        scale = self.sigma_tensor.expand(self.loc.shape)
        return DiagonalNormal(dist.Normal(self.loc, scale), self.loc.dim())


class AutoMCDropout(PerSiteGuide, family="mc_dropout"):
    """MC dropout (Gal & Ghahramani 2016) as a per-site variational family.

    Every weight of two or more dimensions is ``M diag(z) + sigma E`` with input columns (or
    input channels) kept with probability ``1 - p``; biases are ``N(b, sigma^2)``. Only the
    means are learned: ``n`` parameters per site.

    Parameters
    ----------
    model : callable
        The Pyro model.
    p : float, default 0.1
        Dropout probability of the inputs of every layer but the first (for the first, see
        ``input_p``; use ``guides.AutoMixed`` for a different ``p`` per layer).
    input_p : float, optional
        Dropout probability of the first layer's inputs: the network's own input. By default
        ``p`` when they are features (a first layer with a weight of two dimensions, as Gal's
        UCI regression nets drop input features) and 0 when they are image channels (a
        convolution), as in Gal & Ghahramani's LeNet experiments (dropout after every layer,
        not on the image): dropping input *channels* of a one-channel image drops the whole
        image, and a fraction ``input_p`` of every prediction's draws would see no input.
    sigma : float, default 1e-3
        Standard deviation of the narrow Gaussians (fixed).
    init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`; ``init_scale`` is accepted and unused (the
        spread comes from the masks). Constrained sites (a learned noise scale) get the
        diagonal family, as in every family.
    """

    RECIPE = Recipe(
        estimator="auto",
        why="a mask per example, as dropout trains: with one mask shared by the minibatch a "
        "ResNet-8's default call predicts clearly worse (benchmarks/fairness.py at cc5a66b); "
        "no MAP phase: started at the MAP weights it predicts worse than from its own start "
        "(benchmarks/against_map.py)",
        map_start=False,
    )
    site_class = MCDropoutSite
    OBJECTIVE = "mc_dropout"  # a nearly degenerate q: -n log sigma in the ELBO
    variants = {"": {}, "p05": {"p": 0.5}}

    def __init__(self, model: Callable, *, input_p: float | None = None, **options: Any):
        if input_p is not None:
            check_dropout(input_p, options.get("sigma", 1e-3), "input_p")
        super().__init__(model, **options)
        self.input_p = None if input_p is None else float(input_p)
        if input_p is not None:
            self.options["input_p"] = self.input_p  # saved with the guide's spec

    def __setstate__(self, state):
        state = dict(state)
        state.setdefault("input_p", state.get("family_options", {}).get("p", 0.1))  # version 1
        super().__setstate__(state)

    def input_site(self) -> str | None:
        """The first weight (two or more dimensions) in the model's order: the layer that reads
        the network's input, whose dropout probability is ``input_p``."""
        for name, site in self._prototype().iter_stochastic_nodes():
            if site["value"].dim() >= 2:
                return name
        return None

    def site_options_for(self, name: str, cls) -> dict:
        options = super().site_options_for(name, cls)
        if cls is self.site_class and name == self.input_site():
            shape = self._prototype().nodes[name]["value"].shape
            options = {**options, "p": self.input_dropout(options.get("p", 0.1), shape)}
        return options

    def loc_for_mean(self, name: str, mean: torch.Tensor) -> torch.Tensor:
        """``M = W / (1 - p)`` for a weight: the masks keep a fraction ``1 - p`` of ``M``, so
        the mean network is the trained one (biases are their means)."""
        if mean.dim() < 2:
            return mean
        p = self.site_options_for(name, self.site_class).get("p", 0.1)
        return mean / (1.0 - p)

    def input_dropout(self, p: float, shape: torch.Size) -> float:
        """The first layer's dropout probability: ``input_p`` if given, else ``p`` for input
        features (a weight of two dimensions) and 0 for input channels (a convolution's)."""
        if self.input_p is not None:
            return self.input_p
        return p if len(shape) == 2 else 0.0

    @classmethod
    def site_spec(cls, **options: Any) -> SiteSpec:
        check_dropout(options.get("p", 0.1), options.get("sigma", 1e-3))  # before any fit
        return cls.site_class, options
