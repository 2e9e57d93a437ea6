"""Matrix normal (Louizos & Welling 2016, "Structured and efficient variational deep learning
with matrix Gaussian posteriors").

A weight of shape ``(out, in)`` (a conv kernel ``(out, in, kh, kw)`` is read as
``(out, in * kh * kw)``, ``p`` columns) is ``W = M + A E B^T`` with ``E`` standard normal and
``A`` (``out x out``), ``B`` (``p x p``) lower triangular with a positive (softplus) diagonal.
In the row-major vec order used everywhere in this package,

    Cov[vec W] = (A A^T) kron (B B^T),    Var[W_ij] = (A A^T)_ii (B B^T)_jj,
    log det Cov = 2 p sum log diag A + 2 out sum log diag B.

``row="diagonal"`` / ``col="diagonal"`` make ``A`` / ``B`` diagonal, for very wide layers.
Parameters: ``out p`` means plus ``out^2`` (or ``out``) plus ``p^2`` (or ``p``). Sites with fewer
than two dimensions (biases) get the diagonal family.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pyro.nn import PyroParam

from guides.base import PerSiteGuide, SitePosterior, inverse_softplus
from guides.diagonal import DiagonalSite
from guides.gaussian import StructuredGaussian


class MatrixNormal(StructuredGaussian):
    """``MN(M, A A^T, B B^T)`` over a tensor whose first dimension indexes rows.

    Parameters
    ----------
    loc : Tensor
        Mean ``M``, shape ``(out, ...)``; trailing dimensions are flattened into ``p`` columns.
    row_factor : Tensor
        ``(out, out)`` lower triangular with positive diagonal, or ``(out,)`` for a diagonal ``A``.
    col_factor : Tensor
        ``(p, p)`` lower triangular with positive diagonal, or ``(p,)`` for a diagonal ``B``.
    """

    def __init__(self, loc, row_factor, col_factor, validate_args=None):
        self.row_factor = row_factor
        self.col_factor = col_factor
        self.rows = loc.shape[0]
        self.cols = math.prod(loc.shape[1:])
        super().__init__(loc, validate_args=validate_args)

    def _as_matrix(self, flat):
        return flat.reshape(flat.shape[:-1] + (self.rows, self.cols))

    def _deviation(self, eps):
        e = self._as_matrix(eps)
        a, b = self.row_factor, self.col_factor
        e = a.unsqueeze(-1) * e if a.dim() == 1 else a @ e
        e = e * b if b.dim() == 1 else e @ b.mT
        return e.reshape(eps.shape)

    def _mahalanobis(self, diff):
        z = self._as_matrix(diff)
        a, b = self.row_factor, self.col_factor
        if a.dim() == 1:
            z = z / a.unsqueeze(-1)
        else:
            z = torch.linalg.solve_triangular(a, z, upper=False)
        if b.dim() == 1:
            z = z / b
        else:  # z B^{-T}: solve B X^T = z^T
            z = torch.linalg.solve_triangular(b, z.mT, upper=False).mT
        return z.pow(2).sum((-2, -1))

    @staticmethod
    def _diag(factor):
        return factor if factor.dim() == 1 else factor.diagonal()

    def log_det_covariance(self):
        log_a = self._diag(self.row_factor).log().sum()
        log_b = self._diag(self.col_factor).log().sum()
        return 2 * self.cols * log_a + 2 * self.rows * log_b

    @staticmethod
    def _row_sq(factor):
        return factor.pow(2) if factor.dim() == 1 else factor.pow(2).sum(-1)

    def _flat_variance(self):
        var = self._row_sq(self.row_factor).unsqueeze(-1) * self._row_sq(self.col_factor)
        return var.reshape(-1)

    @staticmethod
    def _gram(factor):
        return torch.diag_embed(factor.pow(2)) if factor.dim() == 1 else factor @ factor.mT

    def _dense_covariance(self):
        return torch.kron(self._gram(self.row_factor), self._gram(self.col_factor))

    @property
    def row_covariance(self) -> torch.Tensor:
        """``A A^T`` (``out x out``)."""
        return self._gram(self.row_factor)

    @property
    def col_covariance(self) -> torch.Tensor:
        """``B B^T`` (``p x p``)."""
        return self._gram(self.col_factor)


def _triangular(raw: torch.Tensor) -> torch.Tensor:
    """Lower triangular matrix with ``softplus`` of ``raw``'s diagonal on its diagonal."""
    return raw.tril(-1) + torch.diag_embed(F.softplus(raw.diagonal()))


class MatrixNormalSite(SitePosterior):
    """Parameters ``loc``, ``row_raw`` and ``col_raw`` (triangular factors, or their diagonals)."""

    family = "matrix_normal"

    def __init__(
        self, init_loc: torch.Tensor, init_scale: float, row: str = "full", col: str = "full"
    ):
        super().__init__(init_loc, init_scale)
        for label, value in (("row", row), ("col", col)):
            if value not in ("full", "diagonal"):
                raise ValueError(f"{label} must be 'full' or 'diagonal', got {value!r}")
        rows, cols = init_loc.shape[0], math.prod(init_loc.shape[1:])
        # A = B = sqrt(init_scale) I gives every weight the standard deviation init_scale.
        d = float(inverse_softplus(math.sqrt(init_scale)))
        self.loc = PyroParam(init_loc.detach().clone())
        self.row_raw = PyroParam(self._init_factor(rows, row, d, init_loc))
        self.col_raw = PyroParam(self._init_factor(cols, col, d, init_loc))

    @staticmethod
    def _init_factor(size, kind, d, like):
        if kind == "diagonal":
            return torch.full((size,), d).to(like)
        return torch.diag_embed(torch.full((size,), d)).to(like)

    @classmethod
    def supports(cls, shape: torch.Size) -> bool:
        return len(shape) >= 2

    def distribution(self) -> MatrixNormal:
        row, col = self.row_raw, self.col_raw
        row = F.softplus(row) if row.dim() == 1 else _triangular(row)
        col = F.softplus(col) if col.dim() == 1 else _triangular(col)
        return MatrixNormal(self.loc, row, col)


class AutoMatrixNormal(PerSiteGuide):
    """Matrix-normal guide for every weight with two or more dimensions; diagonal elsewhere.

    Parameters
    ----------
    model : callable
        The Pyro model.
    row, col : {"full", "diagonal"}
        Structure of the row factor ``A`` (``out x out``) and column factor ``B``
        (``in*kh*kw x in*kh*kw``).
    init_scale : float, default 0.01
        Initial standard deviation of every weight.
    """

    site_class = MatrixNormalSite

    def __init__(self, model, *, row: str = "full", col: str = "full", **kwargs):
        super().__init__(model, row=row, col=col, **kwargs)

    def site_class_for(self, name, shape):
        return MatrixNormalSite if MatrixNormalSite.supports(shape) else DiagonalSite
