import pickle

import pytest
import torch

from guides.families.matrix_normal import MatrixNormal, MatrixNormalSite, triangular_factor
from guides.kernels import KroneckerFactorProduct, factor_mask
from tests.guides.conftest import make_site


def van_loan(cov, rows, cols):
    """Rearrange a (rows*cols)^2 matrix so that kron(U, V) becomes vec(U) vec(V)^T."""
    blocks = cov.reshape(rows, cols, rows, cols).permute(0, 2, 1, 3)
    return blocks.reshape(rows * rows, cols * cols)


def test_covariance_is_a_kronecker_product(shape):
    for family in ("matrix_normal", "matrix_normal_diag_rows", "matrix_normal_diag_cols"):
        d = make_site(family, shape).distribution()
        s = torch.linalg.svdvals(van_loan(d.covariance_matrix, *shape))
        assert s[1] / s[0] < 1e-12
        assert torch.allclose(
            d.covariance_matrix, torch.kron(d.row_covariance, d.col_covariance), rtol=1e-12
        )


def test_conv_kernels_are_read_as_out_by_in_kh_kw():
    site = MatrixNormalSite(torch.zeros(4, 3, 2, 2, dtype=torch.float64), 0.1)
    d = site.distribution()
    assert d.rows == 4 and d.cols == 12
    assert d.rsample((2,)).shape == (2, 4, 3, 2, 2)
    assert sum(p.numel() for p in site.parameters()) == 48 + 16 + 144


def test_initial_marginal_scale():
    d = MatrixNormalSite(torch.zeros(5, 7), 0.03).distribution()
    assert torch.allclose(d.variance.sqrt(), torch.full((5, 7), 0.03), rtol=1e-5)


@pytest.mark.parametrize(
    "rows, cols, blocks_a, blocks_b",
    [(7, 5, 2, 3), (1, 9, 1, 4), (10, 10, 3, 3), (33, 130, 4, 2), (40, 64, 1, 1)],
)
def test_block_triangular_product_matches_dense_autograd(rows, cols, blocks_a, blocks_b):
    """A E B^T over diagonal blocks (forward and hand-written backward) against autograd through
    the dense triangular factors, including sizes that do not split evenly."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    raw_a = torch.randn(rows, rows, generator=g, dtype=torch.float64, requires_grad=True)
    raw_b = torch.randn(cols, cols, generator=g, dtype=torch.float64, requires_grad=True)
    e = torch.randn(rows, cols, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    g_log_det = torch.randn((), generator=g, dtype=torch.float64)
    masks = factor_mask(rows, e), factor_mask(cols, e)
    out, log_det = KroneckerFactorProduct.apply(raw_a, raw_b, e, *masks, blocks_a, blocks_b)
    fa, fb = triangular_factor(raw_a), triangular_factor(raw_b)
    ref = fa @ e @ fb.mT
    # log det (A A^T kron B B^T) = 2 log |det (A kron B)|, from the dense Kronecker factor
    ref_log_det = 2 * torch.linalg.slogdet(torch.kron(fa, fb))[1]
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_det, ref_log_det, rtol=1e-11, atol=1e-11)
    grads = torch.autograd.grad((out, log_det), (raw_a, raw_b, e), (upstream, g_log_det))
    expected = torch.autograd.grad((ref, ref_log_det), (raw_a, raw_b, e), (upstream, g_log_det))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


def test_block_triangular_product_gradcheck():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((6, 6), (7, 7), (6, 7))]
    for a in args:
        a.requires_grad_()
    masks = factor_mask(6, args[0]), factor_mask(7, args[0])
    assert torch.autograd.gradcheck(
        lambda a, b, e: KroneckerFactorProduct.apply(a, b, e, *masks, 2, 3), args
    )


def test_raw_and_explicit_factors_give_the_same_distribution():
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(300, 260, generator=g, dtype=torch.float64)
    raw_a = torch.randn(300, 300, generator=g, dtype=torch.float64) * 0.1
    raw_b = torch.randn(260, 260, generator=g, dtype=torch.float64) * 0.1
    fast = MatrixNormal(loc, row_raw=raw_a, col_raw=raw_b)
    slow = MatrixNormal(loc, triangular_factor(raw_a), triangular_factor(raw_b))
    torch.manual_seed(2)
    w_fast = fast.rsample()
    torch.manual_seed(2)
    w_slow = slow.rsample()
    torch.testing.assert_close(w_fast, w_slow, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(fast.log_prob(w_fast), slow.log_prob(w_fast.clone()))
    torch.testing.assert_close(fast.row_factor, slow.row_factor)
    with pytest.raises(ValueError, match="row_factor or row_raw"):
        MatrixNormal(loc, triangular_factor(raw_a), triangular_factor(raw_b), row_raw=raw_a)


def test_log_prob_of_one_draw_reuses_its_log_det_with_the_exact_gradient():
    """One draw computes log det Cov with the sample (KroneckerFactorProduct); log_prob of that
    draw is log q(w(theta), theta) of a dense MultivariateNormal built from the explicit
    factors, in value and in its total derivative with respect to every raw parameter."""
    from torch.distributions import MultivariateNormal

    site = make_site("matrix_normal", (4, 3))
    params = [site.loc, site.row_raw, site.col_raw]
    torch.manual_seed(3)
    d = site.distribution()
    w = d.rsample()
    assert d._drawn_log_det is not None  # the fused path ran
    lp = d.log_prob(w)
    kw = {"allow_unused": True, "materialize_grads": True}  # loc: zero either way
    got = torch.autograd.grad(lp, params, **kw)
    torch.manual_seed(3)
    eps = torch.randn(12, dtype=torch.float64).reshape(4, 3)
    a, b = triangular_factor(site.row_raw), triangular_factor(site.col_raw)
    w_ref = site.loc + a @ eps @ b.mT
    cov = torch.kron(a @ a.mT, b @ b.mT)
    dense = MultivariateNormal(site.loc.reshape(-1), covariance_matrix=cov)
    ref = dense.log_prob(w_ref.reshape(-1))
    torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lp, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(got, torch.autograd.grad(ref, params, **kw)):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


def test_a_draw_without_gradients_leaves_log_prob_its_gradient():
    """A log det drawn under no_grad is not reused by a later log_prob that needs its
    gradient."""
    site = make_site("matrix_normal", (4, 3))
    d = site.distribution()
    with torch.no_grad():
        w = d.rsample()
    lp = d.log_prob(w)
    assert lp.requires_grad
    (g_row,) = torch.autograd.grad(lp, [site.row_raw])
    assert g_row.diagonal().abs().min() > 0  # d log det / d diag


def test_the_factor_mask_cache_is_neither_pickled_nor_traced_anew():
    site = make_site("matrix_normal", (4, 3))
    site.distribution().rsample()
    assert len(site._masks) == 2  # one per factor size
    assert "_masks" not in pickle.loads(pickle.dumps(site)).__dict__
    mask = factor_mask(torch.tensor(5), site.loc, site._masks)  # a size the tracer records
    assert factor_mask(5, site.loc, site._masks) is mask


@pytest.mark.parametrize("n", [16, 1024])
def test_a_step_on_every_raw_entry_moves_a_factor_row_by_a_width_independent_amount(n):
    """Adam moves every raw entry by about the learning rate: the strictly lower entries are
    divided by sqrt(n), so the last row of the factor moves by about lr, not lr sqrt(n - 1)."""
    lr = 1e-3
    raw = torch.zeros(n, n, dtype=torch.float64)
    step = torch.full((n, n), lr, dtype=torch.float64)
    moved = triangular_factor(raw + step) - triangular_factor(raw)
    off = moved.tril(-1)[-1].norm()
    assert off == pytest.approx(lr * ((n - 1) / n) ** 0.5, rel=1e-12)
    torch.testing.assert_close(
        triangular_factor(raw).diagonal(), torch.nn.functional.softplus(raw.diagonal())
    )


@pytest.mark.parametrize("route", ["pickle", "state_dict"])
def test_sites_saved_before_the_scaled_map_load_with_the_same_factors(route):
    g = torch.Generator().manual_seed(3)
    site = MatrixNormalSite(torch.randn(6, 9, generator=g, dtype=torch.float64), 0.1)
    with torch.no_grad():
        for raw in (site.row_raw_unconstrained, site.col_raw_unconstrained):
            raw.add_(0.1 * torch.randn(raw.shape, generator=g, dtype=torch.float64))
    want = site.distribution()
    want_a, want_b = want.row_factor.detach(), want.col_factor.detach()

    def reload(saved_site, version=None):
        if route == "pickle":
            return pickle.loads(pickle.dumps(saved_site))
        state = saved_site.state_dict()
        if version is not None:
            state._metadata[""]["version"] = version
        fresh = MatrixNormalSite(torch.zeros(6, 9, dtype=torch.float64), 0.5)
        fresh.load_state_dict(state)
        return fresh

    same = reload(site).distribution()
    torch.testing.assert_close(same.row_factor, want_a, rtol=0, atol=0)
    torch.testing.assert_close(same.col_factor, want_b, rtol=0, atol=0)

    with torch.no_grad():  # the raw values an older version stored: the factor's entries
        for raw, factor in (
            (site.row_raw_unconstrained, want_a),
            (site.col_raw_unconstrained, want_b),
        ):
            raw.copy_(raw.triu() + factor.tril(-1))
    del site.raw_map
    old = reload(site, version=1)
    assert old.raw_map == MatrixNormalSite.RAW_MAP
    got = old.distribution()
    torch.testing.assert_close(got.row_factor, want_a, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got.col_factor, want_b, rtol=1e-12, atol=1e-15)
    assert isinstance(old.row_raw_unconstrained, torch.nn.Parameter)


def test_the_fused_triangular_factor_is_the_autograd_one():
    """guides.kernels.TriangularFactor against tril + diag_embed under autograd, value and
    gradient (float64), and gradcheck."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(7, 7, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(7, 7, dtype=torch.float64, generator=g)
    reference = raw.tril(-1) / 7**0.5 + torch.diag_embed(
        torch.nn.functional.softplus(raw.diagonal())
    )
    fused = triangular_factor(raw)
    torch.testing.assert_close(fused, reference)
    (expected,) = torch.autograd.grad((reference * weight).sum(), raw)
    (got,) = torch.autograd.grad((fused * weight).sum(), raw)
    torch.testing.assert_close(got, expected)
    assert torch.autograd.gradcheck(lambda r: triangular_factor(r), (raw,))
