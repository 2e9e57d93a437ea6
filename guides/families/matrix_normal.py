"""Matrix normal (Louizos & Welling 2016, "Structured and efficient variational deep learning
with matrix Gaussian posteriors").

A weight of shape ``(out, in)`` (a conv kernel ``(out, in, kh, kw)`` is read as
``(out, in * kh * kw)``, ``p`` columns) is ``W = M + A E B^T`` with ``E`` standard normal and
``A`` (``out x out``), ``B`` (``p x p``) lower triangular with a positive (softplus) diagonal.
The guide learns each factor of size ``n`` through a raw ``n x n`` parameter ``R``:

    A = tril(R, -1) / sqrt(n) + diag(softplus(diag R)).

The ``1 / sqrt(n)`` keeps the factor's rows at a width-independent size while Adam moves every
raw entry by about the learning rate per step: without it the ``n - 1`` off-diagonal entries of
a wide factor's rows wander by ``lr`` each, inflate every weight's variance and slow the fit
(``benchmarks/mnist_accuracy.py`` at ``50cd4a4`` measures the difference). The family is the same;
only its coordinates change.

In the row-major vec order used everywhere in this package,

    Cov[vec W] = (A A^T) kron (B B^T),    Var[W_ij] = (A A^T)_ii (B B^T)_jj,
    log det Cov = 2 p sum log diag A + 2 out sum log diag B.

``row="diagonal"`` / ``col="diagonal"`` make ``A`` / ``B`` diagonal, for very wide layers.
Parameters: ``out p`` means plus ``out^2`` (or ``out``) plus ``p^2`` (or ``p``). Sites with fewer
than two dimensions (biases) get the diagonal family.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from guides.base import PerSiteGuide
from guides.gaussian import StructuredGaussian
from guides.kernels import (
    KroneckerFactorProduct,
    TriangularFactor,
    diagonal_blocks,
    factor_mask,
    offdiag_scale,
    squared_norm,
)
from guides.registry import Recipe
from guides.site import DiagonalSite, SitePosterior, inverse_softplus, param


def triangular_factor(raw: torch.Tensor, masks: dict | None = None) -> torch.Tensor:
    """``tril(raw, -1) / sqrt(n) + diag(softplus(diag raw))`` for an ``n x n`` ``raw``, in one
    pass forward and backward (:class:`guides.kernels.TriangularFactor`); ``masks``: a
    :func:`~guides.kernels.factor_mask` cache."""
    return TriangularFactor.apply(raw, factor_mask(raw.shape[-1], raw, masks))


def _factor_from_raw(raw: torch.Tensor, masks: dict | None) -> torch.Tensor:
    return F.softplus(raw) if raw.dim() == 1 else triangular_factor(raw, masks)


class MatrixNormal(StructuredGaussian):
    """``MN(M, A A^T, B B^T)`` over a tensor whose first dimension indexes rows.

    Parameters
    ----------
    loc : Tensor
        Mean ``M``, shape ``(out, ...)``; trailing dimensions are flattened into ``p`` columns.
    row_factor : Tensor, optional
        ``(out, out)`` lower triangular with positive diagonal, or ``(out,)`` for a diagonal ``A``.
    col_factor : Tensor, optional
        ``(p, p)`` lower triangular with positive diagonal, or ``(p,)`` for a diagonal ``B``.
    row_raw, col_raw : Tensor, optional
        Unconstrained parameters instead of a factor (what the guide learns):
        ``A = tril(row_raw, -1) / sqrt(out) + diag(softplus(diag row_raw))`` (likewise ``B``
        with ``sqrt(p)``), or ``softplus(row_raw)`` when 1-D. Give each factor or its raw
        parameter.
    masks : dict, optional
        A cache the caller owns for :func:`guides.kernels.factor_mask` (a site keeps one, so
        that a draw does not rebuild them).
    """

    def __init__(
        self,
        loc: torch.Tensor,
        row_factor: torch.Tensor | None = None,
        col_factor: torch.Tensor | None = None,
        validate_args: bool | None = None,
        *,
        row_raw: torch.Tensor | None = None,
        col_raw: torch.Tensor | None = None,
        masks: dict | None = None,
    ):
        if (row_factor is None) == (row_raw is None) or (col_factor is None) == (col_raw is None):
            raise ValueError("give row_factor or row_raw, and col_factor or col_raw")
        self._row_factor, self._row_raw = row_factor, row_raw
        self._col_factor, self._col_raw = col_factor, col_raw
        self._masks, self._drawn_log_det = masks, None
        self.rows = loc.shape[0]
        self.cols = math.prod(loc.shape[1:])
        super().__init__(loc, validate_args=validate_args)

    @property
    def row_factor(self) -> torch.Tensor:
        """``A``: ``(out, out)`` lower triangular, or ``(out,)`` when diagonal."""
        return self._factor("_row")

    @property
    def col_factor(self) -> torch.Tensor:
        """``B``: ``(p, p)`` lower triangular, or ``(p,)`` when diagonal."""
        return self._factor("_col")

    def _factor(self, side: str) -> torch.Tensor:
        """The factor ``{side}_factor``, built once from ``{side}_raw`` when not given."""
        if getattr(self, f"{side}_factor") is None:
            raw = getattr(self, f"{side}_raw")
            assert raw is not None  # one of the two is given
            setattr(self, f"{side}_factor", _factor_from_raw(raw, self._masks))
        return getattr(self, f"{side}_factor")

    def _as_matrix(self, flat):
        return flat.reshape(flat.shape[:-1] + (self.rows, self.cols))

    def _deviation(self, eps):
        e = self._as_matrix(eps)
        raw_a, raw_b = self._row_raw, self._col_raw
        if (
            e.dim() == 2
            and raw_a is not None
            and raw_b is not None
            and raw_a.dim() == raw_b.dim() == 2
        ):
            dev, log_det = KroneckerFactorProduct.apply(
                raw_a,
                raw_b,
                e,
                factor_mask(self.rows, e, self._masks),
                factor_mask(self.cols, e, self._masks),
                diagonal_blocks(self.rows, e.device),
                diagonal_blocks(self.cols, e.device),
            )
            self._drawn_log_det = log_det  # for log_prob (log_det_covariance says when)
            return dev.reshape(eps.shape)
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
    def _diag(factor, raw):
        if factor is None:  # softplus of the raw diagonal, without forming the factor
            return F.softplus(raw if raw.dim() == 1 else raw.diagonal())
        return factor if factor.dim() == 1 else factor.diagonal()

    def log_det_covariance(self) -> torch.Tensor:
        drawn = self._drawn_log_det  # computed with a draw, its gradient joined to the draw's
        if drawn is not None and (drawn.requires_grad or not torch.is_grad_enabled()):
            return drawn  # unless drawn without the gradient asked for now
        log_a = self._diag(self._row_factor, self._row_raw).log().sum()
        log_b = self._diag(self._col_factor, self._col_raw).log().sum()
        return 2 * self.cols * log_a + 2 * self.rows * log_b

    @staticmethod
    def _row_sq(factor):
        return factor.pow(2) if factor.dim() == 1 else factor.pow(2).sum(-1)

    def variance_sum(self) -> torch.Tensor:
        """``tr(A A^T kron B B^T) = ||A||_F^2 ||B||_F^2``: the factors', not the ``n`` variances."""
        return squared_norm(self.row_factor.reshape(-1)) * squared_norm(self.col_factor.reshape(-1))

    def _flat_variance(self):
        var = self._row_sq(self.row_factor).unsqueeze(-1) * self._row_sq(self.col_factor)
        return var.reshape(-1)

    @staticmethod
    def gram(factor: torch.Tensor) -> torch.Tensor:
        return torch.diag_embed(factor.pow(2)) if factor.dim() == 1 else factor @ factor.mT

    def _dense_covariance(self):
        return torch.kron(self.gram(self.row_factor), self.gram(self.col_factor))

    supports_local_reparameterization = True

    def prefers_local(self, layer: str, rows: int) -> bool:
        """``estimator="auto"``'s choice: the local reparameterisation on a linear layer
        where it is cheaper than a draw (:meth:`local_is_cheaper`)."""
        return layer == "linear" and self.local_is_cheaper(rows)

    def local_is_cheaper(self, rows: int) -> bool:
        """Whether the local reparameterisation of a linear layer seeing ``rows`` examples
        (``rows (out^2 + p^2)`` multiply-adds for ``B^T x_n`` and ``A eps_n``, full factors) costs
        less than a draw (``out p (out + p)`` for ``A E B^T``): wide layers, small batches."""
        out, p = self.rows, self.cols
        a, b = (self._row_raw, self._row_factor), (self._col_raw, self._col_factor)
        full_a, full_b = (next(t for t in pair if t is not None).dim() == 2 for pair in (a, b))
        local = rows * ((out * out if full_a else out) + (p * p if full_b else p))
        draw = out * p * ((out if full_a else 1) + (p if full_b else 1))
        return local < draw

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``b_n = M x_n + bias + |B^T x_n| A eps_n``, i.e.
        ``b_n ~ N(M x_n + bias, (x_n^T B B^T x_n) A A^T)`` (Louizos & Welling 2016)."""
        mean = F.linear(x, self.mean, bias)
        a, b = self.row_factor, self.col_factor
        xb = x * b if b.dim() == 1 else x @ b  # rows are (B^T x_n)^T
        eps = torch.randn_like(mean)
        noise = eps * a if a.dim() == 1 else eps @ a.mT  # rows are (A eps_n)^T
        norm = torch.linalg.vector_norm(xb, dim=-1, keepdim=True)
        return torch.addcmul(mean, norm, noise)

    @property
    def row_covariance(self) -> torch.Tensor:
        """``A A^T`` (``out x out``)."""
        return self.gram(self.row_factor)

    @property
    def col_covariance(self) -> torch.Tensor:
        """``B B^T`` (``p x p``)."""
        return self.gram(self.col_factor)


#: The largest row or column count a full triangular factor takes (its ``n (n + 1) / 2`` entries).
FULL_MAX = 4096


class MatrixNormalSite(SitePosterior):
    """Parameters ``loc``, ``row_raw`` and ``col_raw`` (triangular factors, or their diagonals)."""

    #: The draw, its noise and gradients, and the factors' products with the noise.
    STEP_BYTES_PER_WEIGHT = 40

    family = "matrix_normal"
    MEAN_PARAMETER = "loc"  # guides.pairs
    fallback = DiagonalSite  # sites of fewer than two dimensions (biases)
    #: Version of the raw -> factor map: 2 divides the strictly lower raw entries by ``sqrt(n)``.
    #: Pickled sites carry it as ``raw_map``; state dicts as the module version (``_version``).
    RAW_MAP = 2
    _version = RAW_MAP

    def __init__(
        self, init_loc: torch.Tensor, init_scale: float, row: str = "full", col: str = "full"
    ):
        super().__init__(init_loc, init_scale)
        for label, value in (("row", row), ("col", col)):
            if value not in ("full", "diagonal"):
                raise ValueError(f"{label} must be 'full' or 'diagonal', got {value!r}")
        rows, cols = init_loc.shape[0], math.prod(init_loc.shape[1:])
        for label, value, size in (("row", row, rows), ("col", col, cols)):
            if value == "full" and size > FULL_MAX:
                raise ValueError(
                    f"a weight of shape {tuple(init_loc.shape)} is viewed as a {rows} x {cols} "
                    f"matrix, and a full {label} factor would hold {size} x {size} numbers; the "
                    f"limit is {FULL_MAX}: pass {label}='diagonal' (guides.family("
                    f"'matrix_normal', {label}='diagonal')) or give this site another family "
                    "through guides.AutoMixed"
                )
        # A = B = sqrt(init_scale) I gives every weight the standard deviation init_scale.
        d = float(inverse_softplus(math.sqrt(init_scale)))
        self.loc = param(init_loc.detach().clone())
        self.row_raw = param(self._init_factor(rows, row, d, init_loc))
        self.col_raw = param(self._init_factor(cols, col, d, init_loc))
        self.raw_map = self.RAW_MAP

    @staticmethod
    def _from_unscaled(raw: torch.Tensor) -> torch.Tensor:
        """Raw values of the current map for a raw factor saved under map 1 (no ``1/sqrt(n)``):
        the same factor."""
        if raw.dim() != 2:
            return raw
        old = raw.detach()
        return old.tril(-1) / offdiag_scale(old.shape[0]) + old.triu()

    def __setstate__(self, state):
        if "raw_map" not in state:  # pickled before the 1 / sqrt(n)
            params = state.get("_parameters", {})
            for key in ("row_raw_unconstrained", "col_raw_unconstrained"):
                raw = params.get(key)
                if raw is not None:
                    params[key] = torch.nn.Parameter(
                        self._from_unscaled(raw), requires_grad=raw.requires_grad
                    )
            state["raw_map"] = self.RAW_MAP
        super().__setstate__(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        if local_metadata.get("version", 1) < self.RAW_MAP:  # a state dict from before
            for key in ("row_raw_unconstrained", "col_raw_unconstrained"):
                if prefix + key in state_dict:
                    state_dict[prefix + key] = self._from_unscaled(state_dict[prefix + key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    @staticmethod
    def _init_factor(size, kind, d, like):
        if kind == "diagonal":
            return torch.full((size,), d).to(like)
        return torch.diag_embed(torch.full((size,), d)).to(like)

    @classmethod
    def supports(cls, shape: torch.Size) -> bool:
        return len(shape) >= 2

    def distribution(self) -> MatrixNormal:
        masks = self.__dict__.setdefault("_masks", {})  # factor_mask's cache, not pickled
        return MatrixNormal(self.loc, row_raw=self.row_raw, col_raw=self.col_raw, masks=masks)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_masks", None)
        return state


class AutoMatrixNormal(PerSiteGuide, family="matrix_normal"):
    """Matrix-normal guide for every weight with two or more dimensions; sites of fewer
    dimensions (biases) get the diagonal family, here and under ``guides.AutoMixed`` alike.

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
    #: Louizos & Welling's own estimator where it is cheaper, with the closed-form KL: a wide
    #: layer's step then never forms ``A E B^T`` (``benchmarks/width.py``).
    RECIPE = Recipe(
        elbo="meanfield",
        estimator="auto",
        why="benchmarks/width.py: on wide linear layers the draw A E B^T makes the step several "
        "times the diagonal's, the local product with the closed-form KL about as cheap as it; "
        "its gradient variance is lower (benchmarks/gradient_variance.py at 6b569da)",
    )
    variants = {"": {}, "diag_rows": {"row": "diagonal"}, "diag_cols": {"col": "diagonal"}}

    def __init__(self, model: Callable, *, row: str = "full", col: str = "full", **kwargs: Any):
        super().__init__(model, row=row, col=col, **kwargs)
