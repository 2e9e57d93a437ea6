"""Walsh-Hadamard algebra and the weight distribution of Walsh-Hadamard variational inference
(WHVI; Rossi, Marmin & Filippone, NeurIPS 2020), below the site modules.

``H`` is the unnormalised Sylvester-Walsh-Hadamard matrix of size ``D = 2^p``,
``H_ij = (-1)^popcount(i & j)`` (symmetric, ``H H = D I``); :func:`fwht` applies it in
``O(D log D)`` by butterfly stages, batched over every leading dimension. With the orthonormal
``H / sqrt(D)``, one ``D x D`` block of a weight is

    W = S1 (H / sqrt(D)) diag(g) (H / sqrt(D)) S2,    W_ij = s1_i s2_j (H g)_{i XOR j} / D,

so a block is ``H g`` gathered at the indices ``i XOR j`` and scaled: drawing a whole weight costs
one transform per block and one gather, ``O(K D log D + out x in)``; a dense ``H`` is held only
for blocks up to ``DENSE_MAX``, where one matrix product replaces about ``3 log2 D`` operations.
:class:`WalshHadamardLayout` says how a weight of any shape is cut into blocks;
:class:`WalshHadamardWeight` is the distribution of ``W`` when ``g ~ N(mu, L L^T)`` per block.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Distribution, constraints
from torch.distributions.kl import register_kl

from guides.gaussian import expanded

_LOG_2PI = math.log(2 * math.pi)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """``H x`` along the last dimension (length a power of two), ``H`` unnormalised: ``log2 D``
    butterfly stages ``(a, b) -> (a + b, a - b)``, each a reshape and two additions."""
    d = x.shape[-1]
    if d & (d - 1) or d == 0:
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {d}")
    lead = x.shape[:-1]
    h = 1
    while h < d:
        pairs = x.reshape(lead + (d // (2 * h), 2, h))
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(lead + (d,))
        h *= 2
    return x


#: Blocks up to this size multiply by a dense ``H`` (one matrix product, ``D^2`` numbers held)
#: instead of the ``log2 D`` butterfly stages: one operation in place of about ``3 log2 D`` (a
#: kernel each on a GPU, a node each in a CUDA graph), at ``D^2`` multiply-adds per row.
DENSE_MAX = 256


def transform(x: torch.Tensor, dense: torch.Tensor | None) -> torch.Tensor:
    """``H x`` along the last dimension: ``x @ dense`` when the dense ``H`` is given (it is
    symmetric), else :func:`fwht`."""
    return fwht(x) if dense is None else x @ dense


def hadamard(d: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The dense ``D x D`` matrix ``H`` (for small sizes and tests)."""
    return fwht(torch.eye(d, dtype=dtype, device=device))


class WalshHadamardLayout:
    """How a weight of shape ``(out, *rest)`` is cut into WHVI blocks.

    The weight is read as a matrix ``out x n`` with ``n = prod(rest)`` (a convolution kernel
    ``(out, in, kh, kw)`` as ``out x (in kh kw)``, its filters as rows), cut into a grid of
    ``D x D`` blocks, each with its own ``g``: ``D = 2^ceil(log2 n)`` (the paper's: one block
    wide) or, given ``block_size``, the smaller of the two. The grid has ``row_blocks =
    ceil(out / D)`` rows of ``column_blocks = ceil(n / D)`` blocks, ``blocks`` in all, block
    ``k = a column_blocks + b`` holding rows ``a D ...`` and columns ``b D ...``; the padding
    is sliced off. ``gather`` holds, for every entry ``(r, j)`` of the weight, the position of
    ``(H g)_{(r mod D) XOR (j mod D)}`` of its block in the flattened ``(blocks, D)``
    transform; ``block`` the row block of every row (``S2`` has one scale per column per row
    block, so that ``block_size=None`` keeps the paper's ``S2`` per block).
    """

    def __init__(self, shape: torch.Size, device=None, block_size: int | None = None):
        if len(shape) < 2:
            raise ValueError(f"WHVI needs a weight of two or more dimensions, got shape {shape}")
        self.shape = torch.Size(shape)
        self.out, self.cols = int(shape[0]), math.prod(int(s) for s in shape[1:])
        self.size = 1 << max(self.cols - 1, 0).bit_length()  # D
        if block_size is not None:
            self.size = min(self.size, int(block_size))
        self.row_blocks = -(-self.out // self.size)
        self.column_blocks = -(-self.cols // self.size)
        self.blocks = self.row_blocks * self.column_blocks  # K
        rows = torch.arange(self.out, device=device)
        cols = torch.arange(self.cols, device=device)
        self.block = rows // self.size
        within = torch.bitwise_xor((rows % self.size)[:, None], cols % self.size)
        grid = self.block[:, None] * self.column_blocks + cols // self.size
        self.gather = grid * self.size + within

    def on(self, gather: torch.Tensor | None, block: torch.Tensor | None) -> WalshHadamardLayout:
        """This layout with its index tensors replaced (a module's buffers, after a move)."""
        new = object.__new__(WalshHadamardLayout)
        new.__dict__.update(self.__dict__, gather=gather, block=block)
        return new


class WalshHadamardWeight(TorchDistribution):
    """``W`` of WHVI: per block ``k``, ``W_k = S1 H diag(g_k) H S2 / D`` with
    ``g_k ~ N(loc_k, L_k L_k^T)``, ``L_k = diag(d_k) U_k`` (``U_k`` unit lower-triangular, or the
    identity for a diagonal ``q(g)``), the blocks independent.

    ``vec(W)`` is Gaussian with a covariance of rank at most ``K D`` in ``out x n`` dimensions, so
    it has no density on the weights; the density lives on ``g``. ``log_prob`` of this
    distribution's own draw ``W`` (the value :meth:`rsample` returned) is

        log q(g) - log p(g) + log p_site(W),    p(g) = N(0, I) per block,

    where ``p_site`` is the model's prior at the site (``prior``; left out when ``None``). In an
    ELBO, ``log p_site(W) - log_prob(W) = log p(g) - log q(g)``: the bound is then that of the
    model whose weight at this site is ``S1 H diag(g) H S2 / D`` with ``g ~ N(0, I)``, the
    family's own prior, with ``S1, S2`` optimised as its hyperparameters (type-II maximum
    likelihood). The closed-form ``KL(q || p)`` registered for it is ``KL(q(g) || N(0, I))``
    whatever ``p`` is, for the same reason. Other values have no density: ``log_prob`` refuses
    them.

    Moments are exact: ``E[W_rj] = c_rj (H loc)_m`` and ``Var[W_rj] = c_rj^2 (H Sigma H)_mm``
    with ``m = (r mod D) XOR j`` and ``c_rj = s1_r s2_{k j} / D``.
    """

    arg_constraints: dict = {}
    has_rsample = True
    #: ``estimator="local"`` on linear layers: :meth:`local_linear`, the fast product.
    supports_local_reparameterization = True

    def __init__(
        self,
        layout: WalshHadamardLayout,
        loc: torch.Tensor,
        scale: torch.Tensor,
        unit: torch.Tensor | None,
        s1: torch.Tensor,
        s2: torch.Tensor,
        prior: Distribution | None = None,
        dense: torch.Tensor | None = None,
        validate_args: bool | None = None,
    ):
        self.layout, self.loc, self.scale, self.unit = layout, loc, scale, unit
        self.dense = dense  # H itself for a small block (DENSE_MAX), or None
        self.prior, self.s1, self.s2 = prior, s1, s2
        self._drawn: tuple | None = None
        super().__init__(torch.Size(), layout.shape, validate_args=validate_args)

    # ---- algebra ----
    @functools.cached_property
    def factor(self) -> torch.Tensor:
        """``c_rj = s1_r s2_{k(r) j} / D``, every entry's factor, ``(out, n)`` (built when a
        weight is; the local product never needs it)."""
        return self.s1[:, None] * self.s2.index_select(0, self.layout.block) / self.layout.size

    def weight(self, g: torch.Tensor) -> torch.Tensor:
        """``W`` for blocks ``g`` of shape ``(..., K, D)``: ``(..., *event_shape)``."""
        lead = g.shape[:-2]
        hg = transform(g, self.dense).reshape(lead + (-1,))
        w = self.factor * hg[..., self.layout.gather]
        return w.reshape(lead + self.event_shape)

    def local_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x W^T + bias`` with a draw of ``g`` per row of ``x`` (each row's output has exactly
        its distribution under ``q``), through the fast transform and never ``W``: per row and
        block ``s1 * H (g * H (s2 * x)) / D``, summed over a row's blocks, ``O(K D log D)``
        plus ``L``'s product."""
        lay = self.layout
        lead = x.shape[:-1]
        width = lay.column_blocks * lay.size
        padded = torch.nn.functional.pad(x, (0, width - lay.cols))
        s2 = torch.nn.functional.pad(self.s2, (0, width - lay.cols))
        grid = (lay.row_blocks, lay.column_blocks, lay.size)
        inputs = padded.reshape(lead + (1,) + grid[1:]) * s2.reshape(grid)  # (..., Kr, Kc, D)
        inner = transform(inputs.reshape(lead + self.loc.shape), self.dense)  # H S2 x per block
        eps = torch.randn(lead + self.loc.shape, dtype=x.dtype, device=x.device)
        rows = transform(self._latent(eps) * inner, self.dense).reshape(lead + grid)
        rows = rows.sum(-2).reshape(lead + (-1,))[..., : lay.out]
        out = rows * (self.s1 / lay.size)
        return out if bias is None else out + bias

    def _latent(self, eps: torch.Tensor) -> torch.Tensor:
        """``g = loc + L eps`` for noise ``eps`` of shape ``(..., K, D)``."""
        if self.unit is not None:  # one (K, N, D) @ (K, D, D) product: U never broadcast
            k, d = self.loc.shape
            rows = eps.reshape(-1, k, d).transpose(0, 1) @ self.unit.mT
            eps = rows.transpose(0, 1).reshape(eps.shape)
        return self.loc + self.scale * eps

    def scale_tril(self) -> torch.Tensor:
        """``L``, ``(K, D, D)``."""
        unit = self.unit if self.unit is not None else torch.diag_embed(torch.ones_like(self.loc))
        return self.scale.unsqueeze(-1) * unit

    def latent_variance(self) -> torch.Tensor:
        """``diag(H Sigma H)`` per block, ``(K, D)``: ``Sigma = L L^T``, so ``|row m of H L|^2``."""
        if self.unit is None:  # Sigma diagonal: (H Sigma H)_mm = sum_k d_k^2 for every m
            return self.scale.pow(2).sum(-1, keepdim=True).expand_as(self.loc)
        rows_of_hl = fwht(self.scale_tril().transpose(-1, -2))  # (K, c, m) = (H L)_{m c}
        return rows_of_hl.pow(2).sum(-2)

    # ---- torch.distributions interface ----
    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self) -> torch.Tensor:
        return self.weight(self.loc).expand(self.batch_shape + self.event_shape)

    @property
    def mode(self) -> torch.Tensor:
        return self.mean

    @property
    def variance(self) -> torch.Tensor:
        v = self.factor.pow(2) * self.latent_variance().reshape(-1)[self.layout.gather]
        return v.reshape(self.event_shape).expand(self.batch_shape + self.event_shape)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        """Dense ``Cov(vec W)`` in row-major order, ``J Sigma J^T`` with ``J = dW / dg``: for
        small sites and tests only."""
        k, d = self.loc.shape
        jac = torch.func.jacrev(lambda g: self.weight(g).reshape(-1))(self.loc)  # (n, K, D)
        jac = jac.reshape(jac.shape[0], k * d)
        tril = torch.block_diag(*self.scale_tril())
        cov = jac @ tril @ tril.T @ jac.T
        return cov.expand(self.batch_shape + cov.shape)

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Any:
        return expanded(self, batch_shape, _instance, "_drawn")

    def mean_value(self) -> torch.Tensor:
        """The mean tensor itself (``W`` at ``g = loc``), whose ``log_prob`` is defined."""
        value = self.mean
        self._drawn = (value, torch.zeros_like(self.loc), self.loc)
        return value

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape + self.loc.shape
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        g = self._latent(eps)
        value = self.weight(g)
        self._drawn = (value, eps, g)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._drawn is None or value is not self._drawn[0]:
            raise ValueError(
                "WHVI's weight distribution has no density on the weights (its covariance has "
                "rank K D); log_prob is defined at its own draws, the values rsample/sample "
                "(or mean_value) returned, where it reads g"
            )
        _, eps, g = self._drawn
        # log N(g; loc, L L^T) - log N(g; 0, I): the 2 pi terms cancel
        ratio = 0.5 * (g.pow(2) - eps.pow(2)).sum((-2, -1)) - self.scale.log().sum()
        if self.prior is not None:
            ratio = ratio + self.prior.log_prob(value)
        return ratio


def latent_kl(q: WalshHadamardWeight) -> torch.Tensor:
    """``KL(q(g) || N(0, I))`` summed over the blocks:
    ``(tr Sigma + |loc|^2 - K D - log det Sigma) / 2`` with ``log det Sigma = 2 sum log d``."""
    trace = q.scale_tril().pow(2).sum() if q.unit is not None else q.scale.pow(2).sum()
    kl = 0.5 * (trace + q.loc.pow(2).sum() - q.loc.numel()) - q.scale.log().sum()
    return kl.expand(q.batch_shape)


@register_kl(WalshHadamardWeight, Distribution)
def _kl_whvi_any(q, p):
    return latent_kl(q)
