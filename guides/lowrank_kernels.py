"""Custom autograd kernels of the low-rank family (``guides/families/lowrank.py``), public names.

Per site ``Cov = D (I + G^T G) D`` with ``D`` the diagonal of standard deviations (``(n,)``, or
``(1,)`` for one value per site) and ``G`` the factor relative to it (``(rank, n)``). A draw
takes noise ``eps = [eps1, eps2]`` (``(S, n + rank)``) to

    w = m + D (eps1 + eps2 G),    z = eps2 - eps1 G^T,    C = I + G G^T,

and the log-density of that draw is

    log q = c - |eps|^2 / 2 - sum log D - (log det C - z^T C^{-1} z) / 2,
    c = -n log(2 pi) / 2.

:class:`LowRankDraw` computes the draw, ``z``, ``C`` and every term of ``log q`` but the
*capacitance part* ``(z^T C^{-1} z - log det C) / 2`` (``rank x rank`` algebra), with one
hand-written backward. :class:`SiteCapacitanceTerms` computes that part for every site of one
rank in one batched factorisation. Together they dispatch a handful of operations per site,
forward and backward, where autograd through the same formulas runs a few dozen
(benchmarks/graph_size.py at 6b9e5b9 counts them). Neither is twice differentiable.

- :func:`gram` (``G G^T`` in column blocks on a many-core CPU), :func:`column_chunks`,
  :func:`blocked`.
- :class:`LowRankDraw` and :class:`SiteCapacitanceTerms`.
"""

from __future__ import annotations

import math

import torch

_LOG_2PI = math.log(2 * math.pi)


#: Columns per block of the Gram product on the CPU, and the factor length from which it is
#: blocked.
GRAM_BLOCK, GRAM_BLOCKED_FROM = 16384, 2**18


def column_chunks(g: torch.Tensor) -> int:
    """How many column blocks to split the long ``(rank, n)`` Gram product into: on the CPU,
    blocks of :data:`GRAM_BLOCK` columns from :data:`GRAM_BLOCKED_FROM` columns on (the blocks'
    batched product keeps each block in cache, and runs on every thread, where BLAS runs one
    product of this small output and million-long reduction on one, at a third of the speed
    on one thread; benchmarks/lowrank_products.py at 6b9e5b9); one block below that and on a GPU.
    (The
    backward's ``A G`` has a large output and runs as one product.)"""
    if g.device.type != "cpu" or g.shape[-1] < GRAM_BLOCKED_FROM:
        return 1
    return g.shape[-1] // GRAM_BLOCK


def blocked(g: torch.Tensor, k: int) -> torch.Tensor:
    """The first ``k * (n // k)`` columns of ``g`` as ``k`` blocks, ``(k, rank, n // k)``."""
    m = g.shape[-1] // k
    return g[:, : k * m].unflatten(1, (k, m)).transpose(0, 1)


def gram(g: torch.Tensor) -> torch.Tensor:
    """``G G^T`` (``rank x rank``)."""
    k = column_chunks(g)
    if k == 1:
        return g @ g.mT
    blocks = blocked(g, k)
    out = torch.bmm(blocks, blocks.mT).sum(0)
    tail = g[:, blocks.shape[0] * blocks.shape[-1] :]
    return out.addmm_(tail, tail.mT) if tail.shape[-1] else out


class LowRankDraw(torch.autograd.Function):
    """One low-rank site's draw and the part of its ``log q`` that needs no factorisation.

    ``apply(loc, d, g, eps)`` with ``loc`` ``(n,)``, ``d`` ``(n,)`` or ``(1,)`` (standard
    deviations), ``g`` ``(rank, n)`` and noise ``eps`` ``(S, n + rank)`` (no gradient) returns

    - ``value`` ``(S, n)``: ``loc + d (eps1 + eps2 G)``;
    - ``z`` ``(S, rank)``: ``eps2 - eps1 G^T``;
    - ``cap`` ``(rank, rank)``: ``C = I + G G^T``;
    - ``rest`` ``(S,)``: ``c - |eps|^2 / 2 - sum log D`` (``n log d`` for one value per site),
      so that ``log q = rest + (z^T C^{-1} z - log det C) / 2``.

    The backward accumulates the three contributions to the gradient of ``G`` into one
    ``(rank, n)`` buffer in place, and the two to ``d`` into one ``addcdiv``.
    """

    @staticmethod
    def forward(ctx, loc, d, g, eps):
        ctx.set_materialize_grads(False)
        n = loc.shape[-1]
        eps1, eps2 = eps[:, :n], eps[:, n:]
        u = torch.addmm(eps1, eps2, g)  # eps1 + eps2 G
        value = torch.addcmul(loc, d, u)
        z = torch.addmm(eps2, eps1, g.mT, alpha=-1.0)
        cap = gram(g)
        cap.diagonal().add_(1.0)
        log_d = d.log().sum()
        if d.shape[-1] != n:  # one standard deviation for the site's n elements
            log_d = log_d * n
        sq = torch.mv(eps, eps[0]) if eps.shape[0] == 1 else eps.pow(2).sum(-1)
        rest = torch.rsub(sq, -0.5 * n * _LOG_2PI, alpha=0.5).sub_(log_d)
        ctx.save_for_backward(d, g, eps, u)
        return value, z, cap, rest

    @staticmethod
    def backward(ctx, grad_value, grad_z, grad_cap, grad_rest):
        d, g, eps, u = ctx.saved_tensors
        n = g.shape[-1]
        eps1, eps2 = eps[:, :n], eps[:, n:]
        one = eps.shape[0] == 1
        grad_loc = grad_d = out = None
        if grad_cap is not None:  # d/dG of <grad_cap, G G^T>
            out = (grad_cap + grad_cap.mT) @ g
        if grad_value is not None:
            grad_loc = grad_value[0] if one else grad_value.sum(0)
            if d.shape[-1] == n:
                grad_d = grad_value[0] * u[0] if one else (grad_value * u).sum(0)
            else:
                grad_d = torch.vdot(grad_value.reshape(-1), u.reshape(-1)).reshape(1)
            out = _accumulate(out, eps2, grad_value * d, one)  # d/dG of <grad value, d eps2 G>
        if grad_rest is not None:  # d/dd of -sum log D, times grad_rest summed over draws
            scale = -1.0 if d.shape[-1] == n else -float(n)
            g_rest = grad_rest[0] if one else grad_rest.sum()
            if grad_d is None:
                grad_d = torch.zeros_like(d)
            grad_d = torch.addcdiv(grad_d, g_rest, d, value=scale)
        if grad_z is not None:  # d/dG of <grad_z, -eps1 G^T>
            out = _accumulate(out, grad_z, eps1, one, alpha=-1.0)
        return grad_loc, grad_d, out, None


def _accumulate(out, a: torch.Tensor, b: torch.Tensor, one: bool, alpha: float = 1.0):
    """``out + alpha a^T b`` for ``a`` ``(S, p)`` and ``b`` ``(S, q)``: in place into ``out``,
    or a new tensor when ``out`` is ``None``."""
    if out is None:
        product = a.mT * b if one else a.mT @ b
        return product if alpha == 1.0 else product.mul_(alpha)
    if one:
        return out.addcmul_(a.mT, b, value=alpha)
    return out.addmm_(a.mT, b, alpha=alpha)


class SiteCapacitanceTerms(torch.autograd.Function):
    """The capacitance part of ``log q`` for ``k`` sites of one rank, one tensor per site in and
    out, from one batched factorisation, with a hand-written backward:

        d log det C = tr(C^{-1} dC),    d z^T C^{-1} z = 2 w^T dz - w^T dC w,    w = C^{-1} z,

    a few batched operations in all, where autograd through a Cholesky factor runs a dozen per
    matrix. ``cholesky_ex`` and triangular solves only: nothing waits for the device (``C >= I``
    here; a non-finite ``C`` gives a non-finite loss, which the divergence guard handles).

    ``apply(cap_1, ..., cap_k, z_1, ..., z_k)`` (``(r, r)`` and ``(r,)`` each) returns the ``k``
    values ``(z_i^T C_i^{-1} z_i - log det C_i) / 2`` (what :class:`LowRankDraw`'s ``rest``
    lacks: ``log q = rest + part``) and then the ``k`` values ``log det C_i``, 0-d each. With
    per-site outputs the backward gathers each group's gradients in one ``stack``, where
    unbinding a batched result costs a backward operation per site.
    """

    @staticmethod
    def forward(ctx, *tensors):
        ctx.set_materialize_grads(False)
        k = len(tensors) // 2
        log_det, quad, inverse, w = _capacitance(torch.stack(tensors[:k]), torch.stack(tensors[k:]))
        ctx.save_for_backward(inverse, w)
        return (*torch.sub(quad, log_det).mul_(0.5).unbind(), *log_det.unbind())

    @staticmethod
    def backward(ctx, *grads):
        inverse, w = ctx.saved_tensors
        k = len(grads) // 2
        g_part, g_log_det = _stacked(grads[:k]), _stacked(grads[k:])
        g_cap = g_z = None
        if g_part is not None:  # d part = (2 w^T dz - w^T dC w - tr(C^{-1} dC)) / 2
            g_cap = torch.addcmul(inverse, w.unsqueeze(-1), w.unsqueeze(-2))
            g_cap = g_cap * (-0.5 * g_part)[:, None, None]
            g_z = w * g_part.unsqueeze(-1)
        if g_log_det is not None:  # d log det C = tr(C^{-1} dC)
            if g_cap is None:
                g_cap = inverse * g_log_det[:, None, None]
            else:
                g_cap.addcmul_(inverse, g_log_det[:, None, None])
        caps = (None,) * k if g_cap is None else g_cap.unbind()
        zs = (None,) * k if g_z is None else g_z.unbind()
        return (*caps, *zs)


def _stacked(grads) -> torch.Tensor | None:
    """The 0-d gradients ``grads`` as one ``(k,)`` tensor (zeros for the ``None`` ones), or
    ``None`` if all are ``None``."""
    known = [g for g in grads if g is not None]
    if not known:
        return None
    if len(known) < len(grads):
        zero = torch.zeros_like(known[0])
        grads = [zero if g is None else g for g in grads]
    return torch.stack(grads)


def _capacitance(cap: torch.Tensor, z: torch.Tensor):
    """``(log det C, z^T C^{-1} z, C^{-1}, w = C^{-1} z)`` for ``C`` ``(S, r, r)``."""
    chol = torch.linalg.cholesky_ex(cap).L
    eye = torch.eye(cap.shape[-1], dtype=cap.dtype, device=cap.device)
    chol_inv = torch.linalg.solve_triangular(chol, eye.expand_as(cap), upper=False)
    inverse = chol_inv.mT @ chol_inv
    w = (inverse @ z.unsqueeze(-1)).squeeze(-1)
    log_det = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return log_det, torch.linalg.vecdot(z, w), inverse, w
