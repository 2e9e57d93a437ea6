"""The low-rank family's products over its ``(rank, n)`` factor, against memory-bound floors.

    python benchmarks/lowrank_products.py                  # the MLP's two large weight sites
    python benchmarks/lowrank_products.py --sizes 313600 --rank 10

Per step the low-rank guide (``guides/families/lowrank.py``) computes, for each site's factor ``G``
(``rank x n``, float32): ``t = eps1 + eps2 G`` and ``u = eps2 - eps1 G^T`` (sampling and the
density of the draw, one ``addmm`` each: ``guides.lowrank_kernels.LowRankDraw``), the Gram
``G G^T`` (the log determinant), and in the backward ``A G`` plus two rank-one terms (the
gradient of ``G``). Each is timed here as the guide runs it and in alternative forms,
interleaved over rounds with the caches flushed before every call (medians), next to two
floors: one read of ``G`` (a sum) and one read plus one write (a copy). The ratio column says
how far each product is from the memory traffic it cannot avoid. This is the evidence behind
the low-rank row of ``step_time.py``; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from guides.lowrank_kernels import blocked, column_chunks, gram


def _candidates(n: int, rank: int) -> tuple[dict, dict]:
    """Name -> (callable, floor name) for one factor size."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(rank, n, generator=gen)
    g_t = g.mT.contiguous()  # the same factor stored (n, rank)
    a = torch.randn(rank, rank, generator=gen)
    eps1, grad_t = torch.randn(2, 1, n, generator=gen)
    eps2, grad_z = torch.randn(2, 1, rank, generator=gen)
    out = torch.empty_like(g)

    def blocked_left_product():
        res = torch.empty_like(g)
        k = column_chunks(g)
        blocks = blocked(g, k)
        torch.bmm(a.expand(k, *a.shape), blocks, out=blocked(res, k))
        done = blocks.shape[0] * blocks.shape[-1]
        if done < n:
            torch.mm(a, g[:, done:], out=res[:, done:])
        return res

    def backward_as_guide():
        res = a @ g
        res.addcmul_(eps2.mT, grad_t)
        return res.addcmul_(grad_z.mT, eps1, value=-1.0)

    def forward_as_guide():
        return torch.addmm(eps1, eps2, g), torch.addmm(eps2, eps1, g.mT, alpha=-1.0), gram(g)

    rows = {
        "floor: read G (sum)": (lambda: g.sum(), None),
        "floor: read + write G (copy)": (lambda: out.copy_(g), None),
        "t = eps2 G": (lambda: eps2 @ g, "read"),
        "u = eps1 G^T": (lambda: eps1 @ g.mT, "read"),
        "Gram G G^T (guide: column blocks)": (lambda: gram(g), "read"),
        "Gram G G^T (one mm)": (lambda: g @ g.mT, "read"),
        "Gram, factor stored (n, rank)": (lambda: g_t.mT @ g_t, "read"),
        "A G (guide: one mm)": (lambda: a @ g, "copy"),
        "A G (column blocks, as the Gram)": (blocked_left_product, "copy"),
        "A G, factor stored (n, rank)": (lambda: g_t @ a.mT, "copy"),
        "forward: t, u, Gram (guide)": (forward_as_guide, "read"),
        "backward: A G + 2 rank-one (guide)": (backward_as_guide, "copy"),
    }
    linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if linear is not None and torch.backends.mkldnn.is_available():  # private; may change
        rows["Gram, oneDNN linear (private op)"] = (
            lambda: linear(g, g, None, "none", [], ""),
            "read",
        )
        rows["A G, oneDNN linear (private op)"] = (
            lambda: linear(g.mT, a, None, "none", [], ""),
            "copy",
        )
    try:
        from scipy.linalg import blas

        g_f = g.numpy().T  # (n, rank), Fortran order: no copy
        rows["Gram, SciPy's OpenBLAS ssyrk"] = (lambda: blas.ssyrk(1.0, g_f, trans=1), "read")
    except ImportError:
        pass
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[784 * 400, 400 * 400])
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=9, help="timed calls per row per round")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flush = torch.empty(64 * 2**20 // 4)  # 64 MiB, twice this machine's last-level cache

    print(f"rank {args.rank}, {torch.get_num_threads()} threads, float32, caches flushed\n")
    print("| n | product | ms | x its floor |")
    print("| ---: | --- | ---: | ---: |")
    for n in args.sizes:
        rows = _candidates(n, args.rank)
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, (fn, _floor) in rows.items():
                for _ in range(args.calls):
                    flush.add_(1.0)
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        med = {name: 1000 * statistics.median(ts) for name, ts in times.items()}
        floors = {"read": med["floor: read G (sum)"], "copy": med["floor: read + write G (copy)"]}
        for name, (_fn, floor) in rows.items():
            ratio = f"{med[name] / floors[floor]:.2f}" if floor else "-"
            print(f"| {n:,} | {name} | {med[name]:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
