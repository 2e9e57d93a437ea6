"""Custom autograd kernels and blocked products behind the posterior families.

Each family's distribution calls these; benchmarks and tests import them by these public names.
They are written for speed on the CPU and CUDA alike: in-place accumulation in hand-written
backward passes, and block products that skip the zero half of a triangular factor. None is
twice differentiable.

- :func:`squared_norm` (:class:`SquaredNorm`): ``sum(x^2)`` over the last dimension.
- Low rank: in :mod:`guides.lowrank_kernels`.
- Matrix normal: :class:`KroneckerFactorProduct` (``A E B^T`` over triangular factors) and its
  block helpers (:func:`lower_left`, :func:`right_lower_t`, :func:`lower_t_left`,
  :func:`right_lower`, :func:`masked_product`, :func:`factor_mask`,
  :func:`effective_factor`), and :class:`TriangularFactor` (a factor alone, for the local
  reparameterisation).
- Tridiagonal: :func:`bidiagonal_solve` (a parallel prefix scan), :class:`PoschSample` (one
  site); every Posch site drawn at once is in :mod:`guides.posch_joint`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


# ---- shared ----------------------------------------------------------------------------------
class SquaredNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.linalg.vector_norm(x, dim=-1).square()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return x * (2 * grad).unsqueeze(-1)


def noise_squared_norm(x: torch.Tensor) -> torch.Tensor:
    """``sum(x^2)`` over the last dimension of noise (no gradient): one ``dot`` for a vector."""
    if x.dim() == 1 and not x.requires_grad:
        return torch.dot(x, x)
    return squared_norm(x)


def squared_norm(x: torch.Tensor) -> torch.Tensor:
    """``sum(x^2)`` over the last dimension in one pass (and one pass backward)."""
    if not x.requires_grad:
        return torch.linalg.vector_norm(x, dim=-1).square()
    return SquaredNorm.apply(x)


# ---- matrix normal -------------------------------------------------------------------------
def block_bounds(n: int, blocks: int) -> list[int]:
    return [n * i // blocks for i in range(blocks + 1)]


def lower_left(low: torch.Tensor, x: torch.Tensor, q: list[int]) -> torch.Tensor:
    """``L X`` for lower triangular ``L`` (``n x n``), skipping its zero blocks."""
    if len(q) == 2:
        return low @ x
    out = x.new_empty(low.shape[0], x.shape[1])
    for i, j in zip(q[:-1], q[1:]):
        torch.mm(low[i:j, :j], x[:j], out=out[i:j])
    return out


def right_lower_t(x: torch.Tensor, low: torch.Tensor, q: list[int]) -> torch.Tensor:
    """``X L^T`` for lower triangular ``L``."""
    if len(q) == 2:
        return x @ low.mT
    out = x.new_empty(x.shape[0], low.shape[0])
    for i, j in zip(q[:-1], q[1:]):
        torch.mm(x[:, :j], low[i:j, :j].mT, out=out[:, i:j])
    return out


def lower_t_left(low: torch.Tensor, x: torch.Tensor, q: list[int]) -> torch.Tensor:
    """``L^T X`` for lower triangular ``L``."""
    if len(q) == 2:
        return low.mT @ x
    out = x.new_empty(low.shape[1], x.shape[1])
    for i, j in zip(q[:-1], q[1:]):
        torch.mm(low[i:, i:j].mT, x[i:], out=out[i:j])
    return out


def right_lower(x: torch.Tensor, low: torch.Tensor, q: list[int]) -> torch.Tensor:
    """``X L`` for lower triangular ``L``."""
    if len(q) == 2:
        return x @ low
    out = x.new_empty(x.shape[0], low.shape[1])
    for i, j in zip(q[:-1], q[1:]):
        torch.mm(x[:, i:], low[i:, i:j], out=out[:, i:j])
    return out


def masked_product(x: torch.Tensor, y: torch.Tensor, q: list[int], mask: torch.Tensor):
    """``mask * (X Y)`` (square) for a ``mask`` that is zero above the diagonal, computing only
    the blocks on and below the diagonal."""
    if len(q) == 2:
        return torch.mm(x, y).mul_(mask)
    out = x.new_zeros(x.shape[0], y.shape[1])
    for i, j in zip(q[:-1], q[1:]):
        out[i:j, :j].addmm_(x[i:j], y[:, :j], beta=0)
    return out.mul_(mask)


def offdiag_scale(n: int) -> float:
    """Factor of the strictly lower raw entries in a triangular factor of size ``n``."""
    return 1.0 / math.sqrt(n)


def factor_mask(n: int, like: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
    """``tril(1, -1) / sqrt(n) + I`` (``n x n``, on ``like``'s device and dtype): ``raw * mask``
    is the triangular factor of ``raw`` with its raw diagonal, and masks the gradient of the
    factor's entries into the gradient of ``raw``. From ``cache`` (a dict its caller owns, keyed
    by size, device and dtype) when given."""
    n = int(n)  # a size the tracer records as a tensor would miss the cache
    key = (n, like.device, like.dtype)
    mask = None if cache is None else cache.get(key)
    if mask is None:
        mask = torch.ones(n, n, dtype=like.dtype, device=like.device).tril_(-1)
        mask.mul_(offdiag_scale(n)).fill_diagonal_(1.0)
        if cache is not None:
            cache[key] = mask
    return mask


def effective_factor(raw: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The triangular factor of ``raw`` (strictly lower entries over ``sqrt(n)``, ``softplus`` of
    the diagonal, zeros above) and that diagonal, without autograd."""
    a = raw.detach() * mask
    diag = F.softplus(raw.detach().diagonal())
    a.diagonal().copy_(diag)
    return a, diag


class TriangularFactor(torch.autograd.Function):
    """The triangular factor of ``raw`` (:func:`effective_factor`: ``raw * mask`` with
    ``softplus`` on the diagonal) in one pass forward and one backward: the gradient of ``raw``
    is the factor's gradient times ``mask``, its diagonal times ``sigmoid(diag raw)``. What the
    matrix normal's local reparameterisation multiplies by (``tril``, ``diag_embed`` and their
    backward passes under autograd read and write the ``n x n`` factor several times each)."""

    @staticmethod
    def forward(ctx, raw, mask):
        ctx.save_for_backward(raw, mask)
        return effective_factor(raw, mask)[0]

    @staticmethod
    def backward(ctx, grad):
        raw, mask = ctx.saved_tensors
        grad_raw = grad * mask
        grad_raw.diagonal().mul_(torch.sigmoid(raw.detach().diagonal()))
        return grad_raw, None


class KroneckerFactorProduct(torch.autograd.Function):
    """``A E B^T`` for one draw ``E`` (``out x p``), with ``A = tri(raw_a)`` and
    ``B = tri(raw_b)``, ``tri(r) = tril(r, -1) / sqrt(n) + diag(softplus(diag r))``, and
    ``log det (A A^T kron B B^T) = 2 p sum log diag A + 2 out sum log diag B``.

    ``mask_a`` and ``mask_b`` are :func:`factor_mask` of each size. The products run over the
    blocks on and below the diagonal of each triangular factor (``k`` blocks do ``(k + 1) / 2k``
    of a dense product's work), forward and backward, and the factors are never formed as
    separate masked copies under autograd (``tril`` + ``diag_embed`` of a ``784 x 784`` factor,
    forward and backward, cost several milliseconds per CPU step); the log-determinant reuses
    the factors' diagonals, and its gradient joins theirs in one pass. Not twice
    differentiable.
    """

    @staticmethod
    def forward(ctx, raw_a, raw_b, e, mask_a, mask_b, blocks_a, blocks_b):
        qa, qb = block_bounds(raw_a.shape[0], blocks_a), block_bounds(raw_b.shape[0], blocks_b)
        (a, diag_a), (b, diag_b) = effective_factor(raw_a, mask_a), effective_factor(raw_b, mask_b)
        c = right_lower_t(e, b, qb)  # E B^T
        ctx.save_for_backward(raw_a, raw_b, a, b, e, c, mask_a, mask_b, diag_a, diag_b)
        ctx.bounds = qa, qb
        rows, cols = e.shape
        log_det = torch.add(diag_a.log().sum() * (2 * cols), diag_b.log().sum(), alpha=2 * rows)
        return lower_left(a, c, qa), log_det

    @staticmethod
    def backward(ctx, grad, g_log_det):
        raw_a, raw_b, a, b, e, c, mask_a, mask_b, diag_a, diag_b = ctx.saved_tensors
        qa, qb = ctx.bounds
        rows, cols = e.shape
        grad_a = grad_b = grad_e = None
        if ctx.needs_input_grad[0]:
            grad_a = masked_product(grad, c.mT, qa, mask_a)
            _diagonal_chain(grad_a.diagonal(), g_log_det, 2 * cols, diag_a, raw_a)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_c = lower_t_left(a, grad, qa)  # A^T dD
            if ctx.needs_input_grad[1]:
                grad_b = masked_product(grad_c.mT, e, qb, mask_b)
                _diagonal_chain(grad_b.diagonal(), g_log_det, 2 * rows, diag_b, raw_b)
            if ctx.needs_input_grad[2]:
                grad_e = right_lower(grad_c, b, qb)
        return grad_a, grad_b, grad_e, None, None, None, None


def _diagonal_chain(g_diag, g_log_det, weight, diag, raw) -> None:
    """In place: the gradient of a factor's diagonal entries (``g_diag``), plus that of
    ``weight * sum log diag``, taken through ``diag = softplus(diag raw)``."""
    g_diag.addcdiv_(g_log_det, diag, value=weight).mul_(torch.sigmoid(raw.detach().diagonal()))


def diagonal_blocks(n: int, device: torch.device) -> int:
    """Diagonal blocks to split a factor of size ``n`` into: on the CPU the skipped zero blocks
    pay for the extra calls from a few hundred rows on; CUDA kernels are launch bound here."""
    if device.type != "cpu" or n < 256:
        return 1
    return 2 if n < 512 else 4


# ---- tridiagonal ---------------------------------------------------------------------------
def bidiagonal_solve(diag: torch.Tensor, sub: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Solve ``L z = rhs`` for lower-bidiagonal ``L`` (``diag`` (n,), ``sub`` (n-1,)).

    The recurrence ``z_i = (rhs_i - sub_{i-1} z_{i-1}) / diag_i`` is an affine scan; it is
    evaluated as a parallel prefix (Hillis-Steele) in ``ceil(log2 n)`` vectorised steps.
    """
    u = rhs / diag
    b = F.pad(-sub / diag[1:], (1, 0))  # z_i = u_i + b_i z_{i-1}, b_0 = 0
    b = b.expand_as(u)
    n = u.shape[-1]
    shift = 1
    while shift < n:
        u = torch.cat([u[..., :shift], u[..., shift:] + b[..., shift:] * u[..., :-shift]], -1)
        b = torch.cat([b[..., :shift], b[..., shift:] * b[..., :-shift]], -1)
        shift *= 2
    return u


class PoschSample(torch.autograd.Function):
    """``value = loc + tau |m| u`` and ``sum log |m|`` (``|m|`` clamped below by ``c``) for noise
    ``eps`` of shape ``(P, n)``, with ``u_j = sr_j eps_j + cp_j eps_{j-1}``, ``sr_j = sqrt(r_j)``,
    ``cp_j = rho / sqrt(r_{j-1})``; ``sr``, ``cp`` are ``head`` values for ``j < K`` and the
    limit ``lam`` (``sqrt(lambda_+)``) beyond. A hand-written backward: autograd would keep a
    dozen ``n``-sized intermediates per step."""

    @staticmethod
    def forward(ctx, loc, tau, rho, head, lam, eps, c):
        ctx.set_materialize_grads(False)
        k = head.shape[0]
        m_abs = loc.abs().clamp_min_(c)
        u = eps * lam
        u[:, 1:].addcmul_(eps[:, :-1], rho / lam)
        u[:, :k] = head * eps[:, :k]
        u[:, 1:k].addcmul_(eps[:, : k - 1], rho / head[:-1])
        value = torch.addcmul(loc, m_abs * u, tau)
        ctx.save_for_backward(loc, m_abs, tau, rho, head, lam, eps, u)
        ctx.c = c
        return value, m_abs.log().sum()

    @staticmethod
    def backward(ctx, g_value, g_log):
        loc, m_abs, tau, rho, head, lam, eps, u = ctx.saved_tensors
        k = head.shape[0]
        g_tau = g_rho = g_head = g_lam = None
        g_m = g_loc = None  # d/d|m|, d/dloc
        if g_value is not None:
            one = g_value.shape[0] == 1  # one draw: rows are views, no sums over draws
            g_loc = g_value[0] if one else g_value.sum(0)  # read-only here
            g_vu = g_value[0] * u[0] if one else (g_value * u).sum(0)
            g_tau = torch.dot(g_vu, m_abs)
            g_m = g_vu.mul_(tau)
            # d/du = tau |m| g_value; contract with the noise each coefficient multiplies
            g_vm = g_value * m_abs
            g_sr_tail = tau * torch.dot(g_vm[:, k:].reshape(-1), eps[:, k:].reshape(-1))
            g_cp_tail = tau * torch.dot(g_vm[:, k:].reshape(-1), eps[:, k - 1 : -1].reshape(-1))
            g_head = tau * (g_vm[:, :k] * eps[:, :k]).sum(0)
            g_prev = tau * (g_vm[:, 1:k] * eps[:, : k - 1]).sum(0)
            g_head[:-1] -= g_prev * rho / head[:-1].pow(2)
            g_rho = (g_prev / head[:-1]).sum() + g_cp_tail / lam
            g_lam = g_sr_tail - g_cp_tail * rho / lam.pow(2)
        if g_log is not None:
            if g_m is None:
                g_m = g_log / m_abs
            else:
                g_m.addcdiv_(g_log.expand_as(m_abs), m_abs)
        # d|m|/dm = sign(m), and 0 where |m| is clamped
        assert g_m is not None, "the draw's value or log-density has a gradient"
        g_m.mul_(torch.sign(loc)).masked_fill_(m_abs <= ctx.c, 0.0)
        g_loc = g_m if g_loc is None else g_m.add_(g_loc)
        return g_loc, g_tau, g_rho, g_head, g_lam, None, None
