"""Posch & Pilz's ratio sequence, and every Posch site of a guide drawn in one pass.

A Posch site (:class:`guides.families.tridiagonal.PoschSite`) of ``n`` elements has two scalars,
``tau > 0`` and ``rho`` in ``(-1/2, 1/2)``, and its draw is

    w_j = m_j + tau |m_j| (sqrt(r_j) eps_j + rho / sqrt(r_{j-1}) eps_{j-1}),   eps ~ N(0, I),
    log q(w) = -1/2 (|eps|^2 + 2 n log tau + 2 sum_j log |m_j| + sum_j log r_j + n log 2 pi),

with ``|m|`` clamped below by ``min_abs_mean`` and ``r_j`` the ratio sequence of
:func:`posch_ratio_table` (``r_1 = 1``; the term in ``eps_{j-1}`` is absent for ``j = 1``).

Drawn one site at a time, a network of ``S`` sites pays a few dozen small operations per site,
forward and backward; on a GPU every one is a kernel launch (and a node of a CUDA graph), which
costs more than the arithmetic. :func:`posch_joint_draw` draws every site at once on their
concatenated means (``N = sum n_s`` elements): the noise drawn site by site (the same numbers as
each site on its own), the per-element coefficients gathered from the ``(S, K + 1)`` table of
ratios through the index tensors of a :class:`PoschLayout`, and the sites' ``log q`` as sums over
segments. Apart from the noise, the count of operations no longer grows with the number of
sites. A gather is cheap on a GPU and several times a plain
pass on the CPU, so :func:`joint_draw_pays` decides where it is used.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# r_k -> lambda_+ geometrically (relative gap of order q^k, and q <= 0.9735 under the gamma
# clamp), so beyond this many elements r_k equals lambda_+ far below float64 precision.
RATIO_TERMS = 2048

_LOG_2PI = math.log(2 * math.pi)

#: On the CPU the joint draw pays below this many elements per site (benchmarks/posch_joint.py at
#: 6b9e5b9).
CPU_JOINT_ELEMENTS_PER_SITE = 8192


def joint_draw_pays(elements: int, sites: int, device: torch.device) -> bool:
    """Whether drawing ``sites`` Posch sites of ``elements`` weights in all jointly is faster
    than site by site.

    On a GPU always: every operation is a kernel launch that costs more than a pass over a few
    hundred thousand elements, and the joint draw's operations do not grow with the number of
    sites. On the CPU an operation's fixed cost is small and a gather or scatter over the
    elements (which the joint draw needs and the per-site kernel does not) costs several plain
    passes, so the joint draw saves a fixed cost per site and pays a cost per element: it is
    taken below :data:`CPU_JOINT_ELEMENTS_PER_SITE` elements per site.
    """
    return device.type != "cpu" or elements < CPU_JOINT_ELEMENTS_PER_SITE * sites


def posch_ratio_table(
    rho: torch.Tensor, width: int, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r_1 .. r_width)`` and ``lambda_+`` for each of ``S`` sites.

    ``r_k = lambda_+ (1 - q^{k+1}) / (1 - q^k)`` with ``lambda_pm = (1 pm sqrt(1 - 4 rho^2)) / 2``
    and ``q = lambda_- / lambda_+``, evaluated as ``expm1(-(k+1) t) / expm1(-k t)``, ``t = -log
    q``: finite for large ``k`` and as ``|rho| -> 1/2``.

    Parameters
    ----------
    rho : Tensor
        ``(S,)`` neighbour correlations.
    width : int
        Terms per site (at most :data:`RATIO_TERMS` are ever needed).
    like : Tensor
        Gives the dtype and device.

    Returns
    -------
    table : Tensor
        ``(S, width)``, ``table[s, k - 1] = r_k`` of site ``s``.
    lam_plus : Tensor
        ``(S, 1)``, the limit of ``r_k``.
    """
    k = torch.arange(1, width + 1, dtype=like.dtype, device=like.device)
    rho = rho.unsqueeze(-1)
    s = torch.sqrt(1 - 4 * rho.pow(2))
    lam_plus = (1 + s) / 2
    q = 4 * rho.pow(2) / (1 + s).pow(2)  # lambda_- / lambda_+, without cancellation
    tiny = torch.finfo(like.dtype).tiny
    t = (-torch.log(q.clamp_min(tiny))).clamp_min(1e-12)
    return lam_plus * torch.expm1(-(k + 1) * t) / torch.expm1(-k * t), lam_plus


def posch_ratios(rho: torch.Tensor, n: int, like: torch.Tensor):
    """``(r_1 .. r_K, lambda_+)`` with ``K = min(n, RATIO_TERMS)``; ``r_k = lambda_+`` for
    ``k > K``."""
    (ratios,) = batched_posch_ratios(rho.reshape(1), [n], like)
    return ratios


def batched_posch_ratios(rho: torch.Tensor, sizes: list[int], like: torch.Tensor):
    """:func:`posch_ratios` of several sites at once: ``rho`` of shape ``(S,)``, ``sizes`` the
    sites' element counts; one table (:func:`posch_ratio_table`), then each
    site's head sliced from it (the same values as one site at a time)."""
    table, lam_plus = posch_ratio_table(rho, min(max(sizes), RATIO_TERMS), like)
    return [(table[i, : min(n, RATIO_TERMS)], lam_plus[i, 0]) for i, n in enumerate(sizes)]


class PoschLayout:
    """Where each element of the concatenated sites reads its coefficients: built once per
    guide, set of site sizes and device (:meth:`for_sites`), then only read.

    Parameters
    ----------
    sizes : list of int
        Element counts ``n_s`` of the ``S`` sites, in concatenation order.
    like : Tensor
        Gives the device and the floating dtype of the weights.

    Attributes
    ----------
    width : int
        ``K = min(max n_s, RATIO_TERMS)``: the table has ``K`` ratio columns and one column
        for ``lambda_+``, ``(S, K + 1)``.
    site_of : Tensor
        ``(N,)`` long: the site of each element.
    ratio_index : Tensor
        ``(N,)`` long: index of ``r_j`` of each element in the flattened table (its site's
        ``lambda_+`` column beyond ``K``).
    previous_index : Tensor
        ``(N,)`` long: the same for ``r_{j-1}``; a site's first element points one past the
        table, at a zero appended to it (no ``eps_{j-1}`` term).
    ratio_weight : Tensor
        ``(S, K + 1)``: how often each table entry occurs in its site, so that
        ``sum_j log r_j = (log table * ratio_weight).sum(-1)``.
    """

    def __init__(self, sizes: list[int], like: torch.Tensor):
        # Built on the CPU and moved once: nothing here waits for a device.
        self.sizes = list(sizes)
        count = len(sizes)
        self.width = width = min(max(sizes), RATIO_TERMS)
        n = torch.tensor(sizes)
        site_of = torch.repeat_interleave(torch.arange(count), n)
        starts = torch.cumsum(n, 0) - n
        position = torch.arange(sum(sizes)) - starts[site_of]
        row = site_of * (width + 1)
        previous = row + (position - 1).clamp(0, width)
        heads = n.clamp_max(width)
        weight = torch.zeros(count, width + 1, dtype=like.dtype)
        weight[:, :width] = (torch.arange(width) < heads.unsqueeze(-1)).to(like.dtype)
        weight[:, width] = (n - heads).to(like.dtype)
        device = like.device
        self.site_of = site_of.to(device)
        self.ratio_index = (row + position.clamp_max(width)).to(device)
        self.previous_index = torch.where(position == 0, count * (width + 1), previous).to(device)
        self.ratio_weight = weight.to(device)
        #: ``(S,)`` the sizes ``n_s`` in the weights' dtype.
        self.counts = n.to(like.dtype).to(device)

    @classmethod
    def for_sites(cls, cache: dict, sizes: list[int], like: torch.Tensor) -> PoschLayout:
        """The layout for ``sizes`` on ``like``'s device and dtype, from ``cache`` (a plain
        dict the caller owns) or built into it."""
        key = (tuple(sizes), like.device, like.dtype)
        layout = cache.get(key)
        if layout is None:
            layout = cache[key] = cls(sizes, like)
        return layout


def posch_joint_draw(
    locs: list[torch.Tensor],
    tau: torch.Tensor,
    rho: torch.Tensor,
    layout: PoschLayout,
    min_abs_mean: float,
    eps: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """One draw of every Posch site and each site's ``log q`` of it.

    Parameters
    ----------
    locs : list of Tensor
        The sites' means (any shapes, ``n_s`` elements each, as in ``layout``).
    tau, rho : Tensor
        ``(S,)``: each site's ``tau`` (``Var[w_j] = tau^2 max(|m_j|, min_abs_mean)^2``, so
        ``tau`` is a standard deviation relative to ``|m|``) and neighbour correlation.
    layout : PoschLayout
    min_abs_mean : float
    eps : Tensor, optional
        ``(N,)`` standard normal noise; when not given it is drawn site by site, so that the
        draws are the ones each site would make on its own (one call per site: it keeps every
        seeded result of the per-site draw).

    Returns
    -------
    values : list of Tensor
        Each site's draw, shaped like its mean.
    noises : list of Tensor
        Each site's ``eps``, flat ``(n_s,)``.
    log_q : Tensor
        ``(S,)``: ``log q_s(w_s)``, with the same value and total derivative as the site's exact
        density at its draw (its Mahalanobis norm is ``|eps_s|^2``).
    log_m : Tensor
        ``(S,)``: ``sum_j log max(|m_j|, min_abs_mean)`` per site.
    table : Tensor
        ``(S, K + 1)``: the ratios ``r_1 .. r_K`` and ``lambda_+`` of each site.
    """
    loc = torch.cat([m.reshape(-1) for m in locs])
    if eps is None:  # site by site: the same numbers as each site drawing its own
        eps = torch.cat([torch.randn(m.numel(), dtype=m.dtype, device=m.device) for m in locs])
    ratios, lam_plus = posch_ratio_table(rho, layout.width, loc)
    table = torch.cat([ratios, lam_plus], -1)
    root = table.sqrt()
    sr = root.reshape(-1).index_select(0, layout.ratio_index)
    coupling = torch.cat([(rho.unsqueeze(-1) / root).reshape(-1), loc.new_zeros(1)])
    cp = coupling.index_select(0, layout.previous_index)
    u = torch.addcmul(sr * eps, cp, F.pad(eps[:-1], (1, 0)))
    m_abs = loc.abs().clamp_min(min_abs_mean)
    value = torch.addcmul(loc, m_abs * u, tau.index_select(0, layout.site_of))
    count = len(layout.sizes)
    maha = loc.new_zeros(count).index_add(0, layout.site_of, eps.square())
    log_m = loc.new_zeros(count).index_add(0, layout.site_of, m_abs.log())
    log_r = (table.log() * layout.ratio_weight).sum(-1)
    n = layout.counts
    log_det = 2 * n * tau.log() + 2 * log_m + log_r
    log_q = -0.5 * (maha + log_det + n * _LOG_2PI)
    values = [v.reshape(m.shape) for v, m in zip(value.split(layout.sizes), locs)]
    return values, list(eps.split(layout.sizes)), log_q, log_m, table


GAMMA_LIMIT = 10.0


def posch_rho(gamma: torch.Tensor) -> torch.Tensor:
    """``rho = sigmoid(gamma) - 1/2``, ``gamma`` clamped to ``[-10, 10]`` (any shape)."""
    return torch.sigmoid(gamma.clamp(-GAMMA_LIMIT, GAMMA_LIMIT)) - 0.5


def share_posch_work(
    group: list, min_abs_mean: float, layouts: dict, joint: bool | None = None
) -> None:
    """Compute what Posch sites share and hand each its part (:attr:`PoschSite.shared`, read
    by its next :meth:`PoschSite.distribution`): the ratio sequences in one table always, and
    the draw itself when ``joint`` (by default where it pays,
    :func:`guides.posch_joint.joint_draw_pays`; otherwise each site draws with its own kernel).

    ``group`` are sites with one ``min_abs_mean``; ``layouts`` caches the joint draw's index
    tensors (a dict the caller keeps). The caller sets ``shared`` back to ``None`` afterwards.
    """
    locs = [site.loc for site in group]
    sizes = [int(m.numel()) for m in locs]  # ints under the tracer too: the cache key
    rho = posch_rho(torch.stack([site.gamma for site in group]))
    if joint is None:
        joint = joint_draw_pays(sum(sizes), len(sizes), locs[0].device)
    if not joint:
        for site, r, ratios in zip(group, rho, batched_posch_ratios(rho, sizes, locs[0])):
            site.shared = (site.tau, r, ratios, None)
        return
    layout = PoschLayout.for_sites(layouts, sizes, locs[0])
    tau = F.softplus(torch.stack([site.delta for site in group]))
    values, noises, log_q, log_m, table = posch_joint_draw(locs, tau, rho, layout, min_abs_mean)
    parts = zip(group, values, noises, log_q.unbind(), log_m.unbind(), tau, rho)
    for i, (site, value, eps, lq, lm, t, r) in enumerate(parts):
        ratios = (table[i, : min(value.numel(), RATIO_TERMS)], table[i, layout.width])
        site.shared = (t, r, ratios, (value, eps, lq, lm))
