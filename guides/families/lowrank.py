"""Diagonal plus low rank Gaussian.

Per site ``Cov = D^2 + F F^T`` with ``D`` diagonal (standard deviations, ``softplus`` of a free
parameter) and ``F`` of shape ``(n, rank)``. The factor is learned relative to the diagonal,
``F = D G^T`` with ``G`` of shape ``(rank, n)``, so that

    Cov = D (I + G^T G) D,    w = m + D (eps1 + G^T eps2),
    log det Cov = 2 sum log D + log det C,    C = I + G G^T  (rank x rank),

and ``log_prob`` needs no division by ``D`` of an ``n x rank`` array: O(n rank^2), never an
``n x n`` matrix. For the value just drawn, the Mahalanobis norm follows from the noise alone:
``|eps|^2 - z^T C^{-1} z`` with ``z = eps2 - G eps1`` (the part of ``eps`` in the null space of
``[I, G^T]`` is not seen by the density).

``diagonal="constant"`` learns one diagonal value per site (Tomczak et al. 2020 found low-rank
terms help mainly on top of a constant diagonal): ``(rank + 1) n + 1`` parameters instead of
``(rank + 2) n``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from guides.base import PerSiteGuide
from guides.gaussian import StructuredGaussian, expand_to
from guides.kernels import squared_norm
from guides.lowrank_kernels import LowRankDraw, SiteCapacitanceTerms, gram
from guides.site import SitePosterior, inverse_softplus, param


class SharedCapacitance:
    """The capacitance terms of several low-rank draws of one rank, computed together on first
    use.

    Each site's draw registers its ``C = I + G G^T`` and ``z`` (:meth:`add`); the first
    :meth:`terms` asked for evaluates ``(z^T C^{-1} z - log det C) / 2`` and ``log det C`` for
    every registered draw in one :class:`guides.lowrank_kernels.SiteCapacitanceTerms` call,
    instead of a Cholesky factor, a solve and their backward per site. ``AutoLowRank.forward``
    shares one per rank across its sites for one guide call.
    """

    def __init__(self):
        self._caps: list[torch.Tensor] = []
        self._zs: list[torch.Tensor] = []
        self._terms: tuple[torch.Tensor, ...] = ()

    def add(self, cap: torch.Tensor, z: torch.Tensor) -> int:
        """Register one draw's ``C`` (``(r, r)``) and ``z`` (``(r,)``); returns its index."""
        self._caps.append(cap)
        self._zs.append(z)
        return len(self._caps) - 1

    def terms(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``((z^T C^{-1} z - log det C) / 2, log det C)`` of the draw registered as ``i``."""
        k = len(self._caps)
        if len(self._terms) != 2 * k:
            self._terms = SiteCapacitanceTerms.apply(*self._caps, *self._zs)
        return self._terms[i], self._terms[k + i]


class LowRankNormal(StructuredGaussian):
    """``N(loc, diag(diag_scale^2) + cov_factor cov_factor^T)`` over a tensor.

    Parameters
    ----------
    loc : Tensor
        Mean, shaped like the site.
    diag_scale : Tensor
        ``(n,)`` or ``(1,)``: standard deviations ``D`` of the diagonal part.
    cov_factor : Tensor, optional
        ``(n, rank)`` low-rank factor ``F``.
    scaled_factor : Tensor, optional
        ``(rank, n)`` factor relative to the diagonal, ``G = (D^{-1} F)^T``; give this or
        ``cov_factor`` (the guide learns ``G``).
    shared : SharedCapacitance, optional
        Where a single draw's capacitance terms are computed with other sites' of its rank.
    """

    def __init__(
        self,
        loc: torch.Tensor,
        diag_scale: torch.Tensor,
        cov_factor: torch.Tensor | None = None,
        validate_args: bool | None = None,
        *,
        scaled_factor: torch.Tensor | None = None,
        shared: SharedCapacitance | None = None,
    ):
        if (cov_factor is None) == (scaled_factor is None):
            raise ValueError("give exactly one of cov_factor and scaled_factor")
        n = loc.numel()
        self._diag = diag_scale.reshape(-1)  # (n,) or (1,)
        self.diag_scale = diag_scale.expand(n)
        if scaled_factor is None:
            assert cov_factor is not None  # exactly one is given (checked above)
            scaled_factor = (cov_factor / self.diag_scale.unsqueeze(-1)).mT
        self.scaled_factor = scaled_factor
        self._rank = int(scaled_factor.shape[-2])  # a Python int, also while tracing
        self._chol: torch.Tensor | None = None
        self._cap: torch.Tensor | None = None
        self._shared: SharedCapacitance | None = shared
        self._key: int | None = None
        super().__init__(loc, validate_args=validate_args)

    @property
    def cov_factor(self) -> torch.Tensor:
        """``F = D G^T``, ``(n, rank)``."""
        return (self.scaled_factor * self.diag_scale).mT

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def noise_size(self) -> int:
        return self.num_elements + self.rank

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape
        n, g, rank = self.num_elements, self.scaled_factor, self._rank
        eps = torch.randn(shape + (n + rank,), dtype=g.dtype, device=g.device)
        value, z, cap, rest = LowRankDraw.apply(
            self._flat_loc, self._diag, g, eps.view(-1, n + rank)
        )
        value = value.reshape(shape + self.event_shape)
        if self._cap is None:
            self._cap = cap
            if self._shared is not None and not shape:  # one draw: its terms go in the batch
                self._key = self._shared.add(cap, z.view(rank))  # a view: no select backward
        self._cache = (value, z.reshape(shape + (rank,)), rest.reshape(shape))  # eps: in rest
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Exact; for the value just drawn by ``rsample``, ``rest + (z^T C^{-1} z - log det C) / 2``
        with ``rest`` from the draw (:class:`guides.lowrank_kernels.LowRankDraw`) and the
        capacitance part computed with the other sites' of this rank when the guide shares it."""
        if self._cache is None or value is not self._cache[0]:
            return super().log_prob(value)
        if self._key is not None and self._shared is not None:
            part = self._shared.terms(self._key)[0]
        else:
            part = 0.5 * (self._reduced_norm(self._cache[1]) - self._log_det_capacitance())
        return expand_to(self._cache[2] + part, self.batch_shape)

    def _capacitance_cholesky(self):
        """Cholesky factor of ``C = I + G G^T`` (``rank x rank``), computed once."""
        if self._chol is None:
            cap = self._cap
            if cap is None:
                g = self.scaled_factor
                cap = gram(g) + torch.eye(self.rank, dtype=g.dtype, device=g.device)
            # cholesky_ex: no check that waits for the device (C >= I is positive definite; a
            # non-finite C gives a non-finite loss, which the divergence guard handles).
            self._chol = torch.linalg.cholesky_ex(cap).L
        return self._chol

    def _log_det_capacitance(self):
        if self._key is not None and self._shared is not None:
            return self._shared.terms(self._key)[1]
        return 2 * self._capacitance_cholesky().diagonal().log().sum()

    def _reduced_norm(self, z):
        """``z^T C^{-1} z`` for ``z`` of shape ``(..., rank)``."""
        chol = self._capacitance_cholesky()
        sol = torch.linalg.solve_triangular(chol, z.unsqueeze(-1), upper=False).squeeze(-1)
        return sol.pow(2).sum(-1)

    def _mahalanobis(self, diff):
        u = diff / self.diag_scale  # Cov^{-1} = D^-1 (I - G^T C^-1 G) D^-1 (Woodbury)
        return squared_norm(u) - self._reduced_norm(u @ self.scaled_factor.mT)

    def log_det_covariance(self) -> torch.Tensor:
        return torch.add(self._log_det_capacitance(), self.diag_scale.log().sum(), alpha=2)

    def _flat_variance(self):
        return self.diag_scale.pow(2) * (1 + self.scaled_factor.pow(2).sum(-2))

    def _dense_covariance(self):
        f = self.cov_factor
        return torch.diag_embed(self.diag_scale.pow(2)) + f @ f.mT


class LowRankSite(SitePosterior):
    """Parameters ``loc``, ``diag_rho`` (per element or one per site) and ``scaled_factor``
    (``G``, ``(rank, n)``; the covariance factor is ``F = D G^T``)."""

    family = "lowrank"
    MEAN_PARAMETER = "loc"  # guides.pairs

    def __init__(
        self, init_loc: torch.Tensor, init_scale: float, rank: int = 10, diagonal: str = "learned"
    ):
        super().__init__(init_loc, init_scale)
        if diagonal not in ("learned", "constant"):
            raise ValueError(f"diagonal must be 'learned' or 'constant', got {diagonal!r}")
        if int(rank) < 1:
            raise ValueError(f"rank must be a positive integer, got {rank}")
        n = init_loc.numel()
        rank = min(int(rank), n)
        self.loc = param(init_loc.detach().clone())
        size = n if diagonal == "learned" else 1
        # Share the initial variance between the diagonal and the factor: the factor starts at a
        # tenth of it, small but non-zero so that its columns are not symmetric.
        diag_init = init_scale * (0.9**0.5)
        self.diag_rho = param(torch.full((size,), float(inverse_softplus(diag_init))).to(init_loc))
        # G (rank, n) with F = D G^T: entries of variance 0.1 / (0.9 rank) give
        # Var[w] = D^2 (1 + 0.1 / 0.9) = init_scale^2 on average.
        self.rank = rank  # a Python int (the factor's shape is a tensor while tracing)
        factor = torch.randn(rank, n, dtype=init_loc.dtype, device=init_loc.device)
        self.scaled_factor = param(factor * (0.1 / (0.9 * rank)) ** 0.5)
        #: The :class:`SharedCapacitance` of this rank in one guide call
        #: (:meth:`AutoLowRank.forward`); ``None`` outside it.
        self.shared: SharedCapacitance | None = None

    def __setstate__(self, state):
        params = state.get("_parameters", {})
        if "factor_t_unconstrained" in params:  # files from before F = D G^T: convert F to G
            factor_t = params.pop("factor_t_unconstrained")
            scale = F.softplus(params["diag_rho_unconstrained"].detach())
            params["scaled_factor_unconstrained"] = torch.nn.Parameter(factor_t.detach() / scale)
            state["_pyro_params"]["scaled_factor"] = state["_pyro_params"].pop("factor_t")
        state.setdefault("shared", None)  # pickled before these two attributes
        state.setdefault("rank", int(params["scaled_factor_unconstrained"].shape[0]))
        super().__setstate__(state)

    def distribution(self) -> LowRankNormal:
        scale = F.softplus(self.diag_rho)
        shared = getattr(self, "shared", None)
        return LowRankNormal(self.loc, scale, scaled_factor=self.scaled_factor, shared=shared)


class AutoLowRank(PerSiteGuide, family="lowrank"):
    """Per-site diagonal plus low-rank Gaussian guide.

    ``Cov = D^2 + F F^T`` per site, ``F = D G^T`` of shape ``(n, rank)`` (``n`` = elements of the
    site, flattened row-major; ``G`` is the learned factor); ``(rank + 2) n`` parameters.

    Parameters
    ----------
    model : callable
        The Pyro model.
    rank : int, default 10
        Rank of ``F`` (capped at ``n`` for small sites).
    diagonal : {"learned", "constant"}
        A learned standard deviation per element, or one per site (Tomczak et al. 2020).
    init_scale : float, default 0.01
        Initial marginal standard deviation of every weight.
    """

    site_class = LowRankSite
    variants = {"": {}, "constant": {"diagonal": "constant"}}

    def __init__(
        self, model: Callable, *, rank: int = 10, diagonal: str = "learned", **kwargs: Any
    ):
        super().__init__(model, rank=rank, diagonal=diagonal, **kwargs)

    def share_site_work(self) -> list[LowRankSite]:
        """The sites' capacitance terms (``log det C`` and the Mahalanobis part
        ``z^T C^{-1} z``, ``rank x rank`` algebra) are computed in one batched call per rank
        (:class:`SharedCapacitance`) instead of per site."""
        sites = [self.site_posterior(n) for n in self._site_names]
        lowrank = [s for s in sites if isinstance(s, LowRankSite)]
        shared: dict[int, SharedCapacitance] = {}
        for site in lowrank:
            site.shared = shared.setdefault(site.rank, SharedCapacitance())
        return lowrank
