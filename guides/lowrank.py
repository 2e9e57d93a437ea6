"""Diagonal plus low rank Gaussian.

Per site ``Cov = D^2 + F F^T`` with ``D`` diagonal (standard deviations, ``softplus`` of a free
parameter) and ``F`` of shape ``(n, rank)``. Sampling is ``w = m + D eps1 + F eps2``; ``log_prob``
uses the Woodbury identity and the matrix determinant lemma through the ``rank x rank``
capacitance matrix ``C = I + F^T D^{-2} F``: O(n rank^2), never an ``n x n`` matrix.

``diagonal="constant"`` learns one diagonal value per site (Tomczak et al. 2020 found low-rank
terms help mainly on top of a constant diagonal): ``(rank + 1) n + 1`` parameters instead of
``(rank + 2) n``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.nn import PyroParam

from guides.base import PerSiteGuide, SitePosterior, inverse_softplus
from guides.gaussian import StructuredGaussian


class LowRankNormal(StructuredGaussian):
    """``N(loc, diag(diag_scale^2) + cov_factor cov_factor^T)`` over a tensor.

    Parameters
    ----------
    loc : Tensor
        Mean, shaped like the site.
    diag_scale : Tensor
        ``(n,)`` or ``(1,)``: standard deviations of the diagonal part.
    cov_factor : Tensor
        ``(n, rank)`` low-rank factor.
    """

    def __init__(self, loc, diag_scale, cov_factor, validate_args=None):
        n = loc.numel()
        self.diag_scale = diag_scale.expand(n)
        self.cov_factor = cov_factor
        # (rank, n): elementwise work then runs along the long, contiguous axis
        self._factor_t = cov_factor.mT
        self._chol = None
        super().__init__(loc, validate_args=validate_args)

    @property
    def rank(self) -> int:
        return self.cov_factor.shape[-1]

    @property
    def noise_size(self) -> int:
        return self.num_elements + self.rank

    def _deviation(self, eps):
        n = self.num_elements
        return self.diag_scale * eps[..., :n] + eps[..., n:] @ self._factor_t

    def _capacitance_cholesky(self):
        """Cholesky factor of ``C = I + F^T D^-2 F`` (``rank x rank``), computed once."""
        if self._chol is None:
            scaled = self._factor_t / self.diag_scale  # (D^-1 F)^T
            cap = scaled @ scaled.mT
            cap = cap + torch.eye(self.rank, dtype=cap.dtype, device=cap.device)
            self._chol = torch.linalg.cholesky(cap)
        return self._chol

    def _mahalanobis(self, diff):
        chol = self._capacitance_cholesky()
        inv_var = self.diag_scale.pow(-2)
        proj = (diff * inv_var) @ self._factor_t.mT  # F^T D^-2 diff
        sol = torch.linalg.solve_triangular(chol, proj.unsqueeze(-1), upper=False).squeeze(-1)
        return (diff.pow(2) * inv_var).sum(-1) - sol.pow(2).sum(-1)

    def log_det_covariance(self):
        chol = self._capacitance_cholesky()
        return 2 * chol.diagonal().log().sum() + 2 * self.diag_scale.log().sum()

    def _flat_variance(self):
        return self.diag_scale.pow(2) + self._factor_t.pow(2).sum(-2)

    def _dense_covariance(self):
        return torch.diag_embed(self.diag_scale.pow(2)) + self.cov_factor @ self.cov_factor.mT


class LowRankSite(SitePosterior):
    """Parameters ``loc``, ``diag_rho`` (per element or one per site) and ``cov_factor``."""

    family = "lowrank"

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
        self.loc = PyroParam(init_loc.detach().clone())
        size = n if diagonal == "learned" else 1
        # Share the initial variance between the diagonal and the factor: the factor starts at a
        # tenth of it, small but non-zero so that its columns are not symmetric.
        diag_init = init_scale * (0.9**0.5)
        self.diag_rho = PyroParam(
            torch.full((size,), float(inverse_softplus(diag_init))).to(init_loc)
        )
        factor = torch.randn(rank, n, dtype=init_loc.dtype, device=init_loc.device)
        # stored transposed, (rank, n), for speed; the distribution gets F = factor_t^T
        self.factor_t = PyroParam(factor * init_scale * (0.1 / rank) ** 0.5)

    def distribution(self) -> LowRankNormal:
        return LowRankNormal(self.loc, F.softplus(self.diag_rho), self.factor_t.mT)


class AutoLowRank(PerSiteGuide):
    """Per-site diagonal plus low-rank Gaussian guide.

    ``Cov = D^2 + F F^T`` per site, ``F`` of shape ``(n, rank)`` (``n`` = elements of the site,
    flattened row-major); ``(rank + 2) n`` parameters.

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

    def __init__(self, model, *, rank: int = 10, diagonal: str = "learned", **kwargs):
        super().__init__(model, rank=rank, diagonal=diagonal, **kwargs)
