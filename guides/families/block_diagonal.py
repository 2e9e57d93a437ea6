"""Block-diagonal Gaussian (Jospin et al. 2022, appendix A, figure A1b).

Per site the weights are flattened in row-major (C) order, ``w = vec(W)`` of length ``n``, and
cut into ``K = ceil(n / b)`` consecutive blocks of ``b = block_size`` elements (the last block
holds the remaining ``n - (K - 1) b``). Each block has a full covariance ``L_k L_k^T`` with
``L_k`` lower triangular (positive diagonal); weights of different blocks are independent:

    Cov = blockdiag(L_1 L_1^T, ..., L_K L_K^T),    w = m + blockdiag(L_k) eps,
    log det Cov = 2 sum_k sum_i log (L_k)_ii.

Everything is a batched ``b x b`` product or triangular solve: O(n b) time and memory, never an
``n x n`` matrix. The factors are stored for ``K`` whole blocks; the last block's rows beyond
``n`` are padding that no weight reads (a lower-triangular factor's leading rows depend only on
its leading columns, so the last block's covariance is its leading sub-block).

Parameters per site: ``n`` means, ``K b`` diagonal entries ``d`` (``softplus`` of a free
parameter, standard deviations of the factor's diagonal) and ``K b (b - 1) / 2`` strictly lower
entries ``U_k``, learned relative to their row's diagonal, ``L_k = diag(d_k) (I + U_k /
sqrt(b))``. An optimiser's step then moves a weight's correlations by an amount relative to its
standard deviation, whatever that is: a fit from a MAP start begins at standard deviations of a
hundredth of the weights, where a step of the rate's size on an absolute entry would be many
standard deviations. The ``1 / sqrt(b)`` keeps a row's step from growing with ``b`` (as the
matrix normal's factors). ``b = 1`` is the diagonal family.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from guides.base import PerSiteGuide
from guides.checks import is_int
from guides.gaussian import StructuredGaussian
from guides.kernels import offdiag_scale, squared_norm
from guides.registry import Recipe
from guides.site import SitePosterior, SiteSpec, inverse_softplus, param


class BlockDiagonalNormal(StructuredGaussian):
    """``N(loc, blockdiag(L_k L_k^T))`` over a tensor flattened row-major.

    Parameters
    ----------
    loc : Tensor
        Mean, shaped like the site (``n`` elements).
    diag : Tensor
        ``(K, b)`` positive diagonals of the factors ``L_k``, ``K = ceil(n / b)``.
    lower : Tensor
        ``(K, b (b - 1) / 2)`` strictly lower entries of each ``L_k``, in the row-major order of
        ``torch.tril_indices(b, b, -1)``. Entries of the last block beyond ``n`` are ignored.
    unit : bool
        If true, ``lower`` holds the strictly lower entries of ``U_k`` in ``L_k = diag(d_k)
        (I + U_k)`` (entry ``(i, j)`` of ``L_k`` is ``d_ki lower_k[ij]``): the same
        distribution with no gather of ``d`` to the entries.

    Notes
    -----
    Sampling, the variance and ``log det`` work on the packed entries (a gather and an
    ``index_add`` per draw, no ``b x b`` product); the factors ``tril`` are built only for the
    exact solve of a value not drawn here and for the dense covariance.
    """

    def __init__(
        self,
        loc: torch.Tensor,
        diag: torch.Tensor,
        lower: torch.Tensor,
        validate_args: bool | None = None,
        *,
        unit: bool = False,
    ):
        blocks, size = diag.shape
        if blocks != math.ceil(loc.numel() / size) or lower.shape != (
            blocks,
            size * (size - 1) // 2,
        ):
            raise ValueError(
                f"diag must have shape (ceil(n / b), b) and lower (ceil(n / b), b (b - 1) / 2) "
                f"for n = {loc.numel()}; got {tuple(diag.shape)} and {tuple(lower.shape)}"
            )
        self.diag, self.lower, self.unit = diag, lower, unit
        rows, cols = torch.tril_indices(size, size, offset=-1, device=diag.device)
        self._rows, self._cols = rows, cols
        super().__init__(loc, validate_args=validate_args)

    @property
    def block_size(self) -> int:
        return self.diag.shape[-1]

    @property
    def noise_size(self) -> int:
        return self.diag.numel()

    @property
    def tril(self) -> torch.Tensor:
        """The ``(K, b, b)`` lower-triangular factors (built on demand)."""
        blocks, size = self.diag.shape
        flat = self.lower.new_zeros(blocks, size * size)
        flat = flat.index_copy(1, self._rows * size + self._cols, self.lower)
        if self.unit:
            eye = torch.eye(size, dtype=flat.dtype, device=flat.device)
            return (flat.reshape(blocks, size, size) + eye) * self.diag.unsqueeze(-1)
        return flat.reshape(blocks, size, size) + torch.diag_embed(self.diag)

    def _blocks(self, flat: torch.Tensor) -> torch.Tensor:
        """``(..., n)`` -> ``(..., K, b)``, zero-padded."""
        pad = self.noise_size - flat.shape[-1]
        if pad:
            flat = F.pad(flat, (0, pad))
        return flat.reshape(flat.shape[:-1] + tuple(self.diag.shape))

    def _deviation(self, eps):
        e = eps.reshape(eps.shape[:-1] + tuple(self.diag.shape))
        if self.unit:
            dev = self.diag * e.index_add(-1, self._rows, self.lower * e[..., self._cols])
        else:
            dev = (self.diag * e).index_add(-1, self._rows, self.lower * e[..., self._cols])
        return dev.reshape(eps.shape)[..., : self.num_elements]

    def _noise_mahalanobis(self, eps):
        # the real weights' factor is square (the padding's noise reaches no weight)
        return squared_norm(eps[..., : self.num_elements])

    def _mahalanobis(self, diff):
        solved = torch.linalg.solve_triangular(
            self.tril, self._blocks(diff).unsqueeze(-1), upper=False
        )
        flat = solved.squeeze(-1).reshape(diff.shape[:-1] + (-1,))
        return flat[..., : self.num_elements].pow(2).sum(-1)

    def log_det_covariance(self) -> torch.Tensor:
        return 2 * self.diag.reshape(-1)[: self.num_elements].log().sum()

    def _flat_variance(self):
        if self.unit:
            row = torch.ones_like(self.diag).index_add(-1, self._rows, self.lower.pow(2))
            var = self.diag.pow(2) * row
        else:
            var = self.diag.pow(2).index_add(-1, self._rows, self.lower.pow(2))
        return var.reshape(-1)[: self.num_elements]

    def _dense_covariance(self):
        n = self.num_elements
        tril = self.tril
        return torch.block_diag(*(tril @ tril.mT))[:n, :n]


class BlockDiagonalSite(SitePosterior):
    """Parameters ``loc``, ``diag_rho`` (``(K, b)``, ``softplus`` gives the factor's diagonal
    ``d``) and ``lower`` (``(K, b (b - 1) / 2)``: entry ``(i, j)`` of ``L_k`` is
    ``d_ki lower_k[ij] / sqrt(b)``)."""

    family = "block_diagonal"
    MEAN_PARAMETER = "loc"  # guides.pairs
    #: Version of the ``lower -> L`` map: 2 multiplies each entry by its row's diagonal. A
    #: state dict (module version) or pickled site (``lower_map``) of map 1 (``L_ij =
    #: lower_ij / sqrt(b)``) is converted on loading to the same factor.
    LOWER_MAP = 2
    _version = LOWER_MAP
    #: Bytes a step holds per strictly lower entry (its product with the noise, gathered,
    #: and their gradients), besides the weights' :attr:`STEP_BYTES_PER_WEIGHT`.
    STEP_BYTES_PER_LOWER = 10

    @classmethod
    def step_bytes(cls, shape: tuple[int, ...], options: dict) -> int:
        n = math.prod(shape)
        size = min(options.get("block_size", 16), max(n, 1))
        lower = math.ceil(n / size) * size * (size - 1) // 2
        return n * cls.STEP_BYTES_PER_WEIGHT + lower * cls.STEP_BYTES_PER_LOWER

    def __init__(self, init_loc: torch.Tensor, init_scale: float, block_size: int = 16):
        super().__init__(init_loc, init_scale)
        check_block_size(block_size)
        n = init_loc.numel()
        size = min(block_size, max(n, 1))  # a site smaller than a block is one full block
        blocks = math.ceil(n / size)
        self.block_size = size
        self.loc = param(init_loc.detach().clone())
        d = float(inverse_softplus(init_scale))
        self.diag_rho = param(torch.full((blocks, size), d).to(init_loc))
        self.lower = param(torch.zeros(blocks, size * (size - 1) // 2).to(init_loc))
        self.lower_map = self.LOWER_MAP

    @staticmethod
    def _relative(lower: torch.Tensor, diag_rho: torch.Tensor) -> torch.Tensor:
        """Map-2 entries of the factor whose map-1 entries are ``lower`` (the same ``L``)."""
        rows, _ = torch.tril_indices(diag_rho.shape[-1], diag_rho.shape[-1], -1)
        return lower / F.softplus(diag_rho.detach())[:, rows.to(diag_rho.device)]

    def __setstate__(self, state):
        params = state.get("_parameters", {})
        if "lower_map" not in state and "lower_unconstrained" in params:  # pickled under map 1
            old = params["lower_unconstrained"]
            new = self._relative(old.detach(), params["diag_rho_unconstrained"])
            params["lower_unconstrained"] = torch.nn.Parameter(new, old.requires_grad)
            state["lower_map"] = self.LOWER_MAP
        super().__setstate__(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        key, rho = prefix + "lower_unconstrained", prefix + "diag_rho_unconstrained"
        if local_metadata.get("version", 1) < self.LOWER_MAP and key in state_dict:
            if rho in state_dict:  # a state dict from before (missing keys are refused below)
                state_dict[key] = self._relative(state_dict[key], state_dict[rho])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def factor(self) -> torch.Tensor:
        """The ``(K, b, b)`` lower-triangular factors ``L_k``."""
        return self.distribution().tril

    def distribution(self) -> BlockDiagonalNormal:
        diag = F.softplus(self.diag_rho)
        unit = self.lower * offdiag_scale(diag.shape[-1])
        return BlockDiagonalNormal(self.loc, diag, unit, unit=True)


def check_block_size(block_size: int) -> None:
    """Refuse a block size that is not a positive integer."""
    if not is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")


class AutoBlockDiagonal(PerSiteGuide, family="block_diagonal"):
    """Block-diagonal Gaussian guide: full covariance within consecutive blocks of weights.

    ``q(w) = prod_k N(w_k; m_k, L_k L_k^T)`` over blocks of ``block_size`` consecutive elements
    of each site flattened row-major (for a linear weight ``(out, in)``: runs of inputs of one
    output unit).

    Parameters
    ----------
    model : callable
        The Pyro model.
    block_size : int, default 16
        Elements per block ``b``; a site smaller than a block gets one full covariance. Cost per
        site: about ``n (b + 3) / 2`` parameters and O(n b) time per step.
    init_scale : float, default 0.01
        Initial standard deviation of every weight (the factors start diagonal).
    init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`.
    """

    RECIPE = Recipe(
        lr_scale=1.0,
        full_batch_lr_scale=0.3,
        why="each weight's block factor moves its posterior fast: under the full-batch recipe "
        "the toy's fit from 1e-2 ends far worse than from 3e-3; minibatch fits are best from "
        "the task's 3e-3 (benchmarks/fairness.py at cc5a66b, benchmarks/task_rate.py at c1c13dd)",
    )

    site_class = BlockDiagonalSite
    variants = {"": {}, "block2": {"block_size": 2}}

    @classmethod
    def site_spec(cls, **options: Any) -> SiteSpec:
        check_block_size(options.get("block_size", 16))  # before any fit
        return cls.site_class, options
