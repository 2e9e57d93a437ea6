"""The joint Gaussian's pieces, below the guides: its covariance parameters
(:class:`JointCovariance`), its draw with the log-density read from the noise
(:class:`DrawnMultivariateNormal`), a site's marginal under it (:class:`JointSiteMarginal`),
the site that holds the means (:class:`JointLocSite`), and the checks of sizes and masks.
:class:`guides.families.joint.AutoJoint` assembles them."""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
import torch.nn.functional as F

from guides.checks import physical_memory
from guides.memory import BYTES_PER_PARAMETER
from guides.site import (
    SitePosterior,
    inverse_softplus,
    param,
    register_strict_lower,
    unit_lower_triangular,
)

#: The most scalars a full (Cholesky) covariance takes: its factor is ``K x K`` numbers
#: (64 MiB in float32 at 4,096), and each step multiplies by it.
FULL_MAX = 4096


def lower_scale(size: int) -> float:
    """The factor of the off-diagonal parameter of a ``size``-scalar factor: ``N = lower / K``
    (see :class:`JointCovariance`)."""
    return 1.0 / size


class JointCovariance(SitePosterior):
    """The covariance of ``K`` jointly Gaussian scalars, each factor relative to the standard
    deviations ``d = softplus(rho)`` (as the low-rank family learns its factor):

    - full (``rank=None``): ``L = diag(d) (I + N)``, ``N`` strictly lower-triangular, learned
      as ``K N`` (the parameter ``lower``, :func:`lower_scale`);
    - ``rank=r``: ``Sigma = diag(d)^2 + F F^T`` with ``F = diag(d) G``, ``G`` of shape ``K x r``.

    Why ``K N``: Adam moves every parameter by about its learning rate per step, whatever the
    size of its gradient. Learned directly, a row of ``N`` (up to ``K - 1`` entries) moves by
    about ``lr sqrt(K)`` a step; even learned as ``sqrt(K) N`` (the scale of the block-diagonal
    and matrix-normal factors, :func:`guides.kernels.offdiag_scale`) it moves by about ``lr``, and
    over a thousand scalars most of the ``K^2 / 2`` entries have gradients that are Monte Carlo
    noise around zero, so each row random-walks to a spread that costs the ELBO, until the
    joint family ends worse than the diagonal family it contains. As ``K N`` a row moves by
    about ``lr / sqrt(K)``: the walk stays small at any ``K``, and a small set still learns
    strong correlations at a larger learning rate. The set of covariances is the same; only
    the optimiser's geometry changes.

    An off-diagonal entry of ``L`` learned on its own scale grows past a small diagonal within
    a few steps, and a triangular ``L`` whose off-diagonal entries dwarf its diagonal has an
    inverse that grows exponentially with ``K``: its log-density is then rounding error, which
    the optimiser follows to ``-inf``. A ``SitePosterior`` for its parameter access
    (:func:`guides.site.direct_parameters`), not a site of its own."""

    #: Version of the ``lower -> N`` map: 2 divides ``lower`` by ``K``. A state dict
    #: saved under map 1 (``N = lower``) is converted on loading to the same covariance.
    LOWER_MAP = 2
    _version = LOWER_MAP

    def __init__(self, size: int, init_scale: float, rank: int | None, like: torch.Tensor):
        super().__init__(like, init_scale)
        self.rank = rank
        rho = float(inverse_softplus(init_scale))
        self.rho = param(torch.full((size,), rho, dtype=like.dtype, device=like.device))
        if rank is None:  # the strictly lower triangle of N, row by row
            register_strict_lower(self, size, like.device)
            self.lower = param(like.new_zeros(size * (size - 1) // 2))
        else:  # a small random start: at G = 0 the factor's expected gradient is zero
            start = torch.randn(size, rank, dtype=like.dtype, device=like.device)
            self.relative = param(start * (0.1 / math.sqrt(rank)))

    def scale(self) -> torch.Tensor:
        """``d``, ``(K,)``: the diagonal of ``L``, or the diagonal part's standard deviations."""
        return F.softplus(self.rho)

    def scale_tril(self) -> torch.Tensor:
        """``L`` (full covariance only)."""
        size = self.rho.shape[0]
        lower = self.lower * lower_scale(size)
        unit = unit_lower_triangular(lower, self.rows, self.cols, size)
        return self.scale().unsqueeze(-1) * unit

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        key = prefix + "lower_unconstrained"
        if local_metadata.get("version", 1) < self.LOWER_MAP and key in state_dict:
            # N itself: the same factor is K N under map 2
            state_dict[key] = state_dict[key] / lower_scale(self.rho.shape[0])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def factor(self) -> torch.Tensor:
        """``F = diag(d) G`` (low rank only)."""
        return self.scale().unsqueeze(-1) * self.relative

    def distribution(self, loc: torch.Tensor) -> dist.TorchDistribution:  # type: ignore[override]
        """``N(loc, Sigma)`` over the ``K``-vector."""
        if self.rank is None:
            return DrawnMultivariateNormal(loc, scale_tril=self.scale_tril())
        return dist.LowRankMultivariateNormal(loc, self.factor(), self.scale().pow(2))

    def variance(self) -> torch.Tensor:
        """``diag(Sigma)``, ``(K,)``."""
        if self.rank is None:
            return self.scale_tril().pow(2).sum(-1)
        return self.scale().pow(2) + self.factor().pow(2).sum(-1)

    def covariance(self) -> torch.Tensor:
        """The dense ``K x K`` covariance (for small ``K``: checks and plots)."""
        if self.rank is None:
            tril = self.scale_tril()
            return tril @ tril.T
        factor = self.factor()
        return torch.diag_embed(self.scale().pow(2)) + factor @ factor.T


class DrawnMultivariateNormal(dist.MultivariateNormal):
    """``N(loc, L L^T)`` whose log-density at its own draw ``z = loc + L eps`` is read from the
    noise, ``-|eps|^2 / 2 - sum log L_ii - K log(2 pi) / 2``, with no triangular solve (exact in
    any conditioning, and ``O(K)`` past the draw); any other value takes the solve."""

    def rsample(self, sample_shape=()) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        tril = self._unbroadcasted_scale_tril
        value = self.loc + (tril @ eps.unsqueeze(-1)).squeeze(-1)
        self._drawn = (value, eps)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        drawn = getattr(self, "_drawn", None)
        if drawn is None or value is not drawn[0]:
            return super().log_prob(value)
        eps = drawn[1]
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        k = eps.shape[-1]
        return -0.5 * eps.pow(2).sum(-1) - half_log_det - 0.5 * k * math.log(2 * math.pi)


class JointSiteMarginal(dist.TorchDistribution):
    """One site's marginal under the joint Gaussian: ``mean``, ``variance``, its block of the
    joint covariance (``covariance_matrix``, zeros at the site's point-mass scalars) and
    draws. It has no density: the unchosen scalars are points. Draws come from the joint, so
    they agree with :meth:`AutoJoint.sample_posterior`'s marginals."""

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, guide, name: str):  # guide: a guides.families.joint.AutoJoint
        self._guide, self._name = guide, name
        shape = guide.site_posterior(name).loc.shape
        super().__init__(torch.Size(), torch.Size(shape), validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        return self._guide.site_posterior(self._name).loc

    @property
    def variance(self) -> torch.Tensor:
        return self._guide.joint_variance()[self._name]

    @property
    def covariance_matrix(self) -> torch.Tensor:
        n = math.prod(self.event_shape)
        index = self._guide.joint_index(self._name)
        cov = self._guide.joint.covariance()[index][:, index]
        out = cov.new_zeros(n, n)
        rows = self._guide.site_scalars(self._name)
        out[rows[:, None], rows[None, :]] = cov
        return out

    def sample(self, sample_shape=()) -> torch.Tensor:
        n = math.prod(sample_shape)
        draws = self._guide.sample_posterior(max(n, 1))[self._name]
        return draws[:n].reshape(torch.Size(sample_shape) + self.event_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """The Gaussian density of the site's joint scalars (the block of the joint covariance),
        and ``-inf`` where a point-mass scalar is not at its point."""
        loc = self.mean
        batch = value.shape[: value.dim() - loc.dim()]
        flat, centre = value.reshape(batch + (-1,)), loc.reshape(-1)
        rows = self._guide.site_scalars(self._name)
        points = torch.ones_like(centre, dtype=torch.bool)
        points[rows] = False
        off = (flat[..., points] != centre[points]).any(-1)
        out = torch.zeros(batch, dtype=value.dtype, device=value.device)
        if rows.numel():
            out = self._guide.joint_block(self._name).log_prob(flat[..., rows])
        return out.masked_fill(off, float("-inf"))


class JointLocSite(SitePosterior):
    """A joint site's means (``loc``, every scalar's): the chosen scalars' are ``mu``, the
    others are points. Its own distribution is the point mass at ``loc``."""

    #: The site's own weights are point masses; the shared factor is counted on its own.
    STEP_BYTES_PER_WEIGHT = 12

    family = "joint"
    MEAN_PARAMETER = "loc"  # guides.pairs

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__(init_loc, init_scale)
        self.loc = param(init_loc.detach().clone())

    def distribution(self) -> dist.Delta:
        return dist.Delta(self.loc, event_dim=self.loc.dim())


def check_size(size: int, rank: int | None) -> None:
    """Refuse a full covariance of more than :data:`FULL_MAX` scalars, an empty set, a rank
    above the size, or a low-rank factor whose fit would not fit in this machine's memory,
    before anything is allocated."""
    if size < 1:
        raise ValueError("the joint set holds no scalar: choose at least one")
    if rank is not None and rank > size:
        raise ValueError(
            f"rank={rank} is more than the {size} scalars of the joint set: a rank of at most "
            f"{size} (a full covariance: rank=None)"
        )
    memory = physical_memory()
    needed = size * (rank or 0) * BYTES_PER_PARAMETER
    if memory is not None and needed > memory:
        raise ValueError(
            f"a rank-{rank} factor over {size:,} scalars takes {needed / 2**30:,.1f} GiB to fit "
            f"(value, gradient and Adam's state), more than this machine's "
            f"{memory / 2**30:,.1f} GiB: pass a smaller rank or choose fewer scalars"
        )
    if rank is None and size > FULL_MAX:
        mib = size * size * 4 / 2**20
        raise ValueError(
            f"a full covariance of {size:,} scalars is a {size:,} x {size:,} factor ({mib:,.0f} "
            f"MiB in float32, multiplied by at each step; at most {FULL_MAX:,} are taken): pass "
            "rank= (a low-rank plus diagonal covariance) or choose fewer scalars"
        )


def indices(name: str, mask) -> torch.Tensor:
    """Flat indices of a mask given as a bool tensor or as indices; sorted, unique."""
    if isinstance(mask, (list, tuple)) and not mask:
        return torch.zeros(0, dtype=torch.long)  # no scalar of the site: all point masses
    mask = torch.as_tensor(mask)
    if mask.dtype == torch.bool:
        index = mask.reshape(-1).nonzero().reshape(-1)
    elif not mask.dtype.is_floating_point and mask.dim() <= 1:
        index = mask.reshape(-1).long()
    else:
        raise TypeError(f"the mask of {name!r} must be a bool tensor or flat int indices")
    if index.numel() and int(index.min()) < 0:
        raise ValueError(f"the mask of {name!r} has a negative index")
    return torch.unique(index)
