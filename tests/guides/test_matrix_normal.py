import pytest
import torch

from guides.matrix_normal import (
    MatrixNormal,
    MatrixNormalSite,
    _KroneckerFactorProduct,
    _triangular,
)
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
    out = _KroneckerFactorProduct.apply(raw_a, raw_b, e, blocks_a, blocks_b)
    ref = _triangular(raw_a) @ e @ _triangular(raw_b).mT
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out, (raw_a, raw_b, e), upstream)
    expected = torch.autograd.grad(ref, (raw_a, raw_b, e), upstream)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_block_triangular_product_gradcheck():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((6, 6), (7, 7), (6, 7))]
    for a in args:
        a.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b, e: _KroneckerFactorProduct.apply(a, b, e, 2, 3), args
    )


def test_raw_and_explicit_factors_give_the_same_distribution():
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(300, 260, generator=g, dtype=torch.float64)
    raw_a = torch.randn(300, 300, generator=g, dtype=torch.float64) * 0.1
    raw_b = torch.randn(260, 260, generator=g, dtype=torch.float64) * 0.1
    fast = MatrixNormal(loc, row_raw=raw_a, col_raw=raw_b)
    slow = MatrixNormal(loc, _triangular(raw_a), _triangular(raw_b))
    torch.manual_seed(2)
    w_fast = fast.rsample()
    torch.manual_seed(2)
    w_slow = slow.rsample()
    torch.testing.assert_close(w_fast, w_slow, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast.log_prob(w_fast), slow.log_prob(w_fast.clone()))
    torch.testing.assert_close(fast.row_factor, slow.row_factor)
    with pytest.raises(ValueError, match="row_factor or row_raw"):
        MatrixNormal(loc, _triangular(raw_a), _triangular(raw_b), row_raw=raw_a)
