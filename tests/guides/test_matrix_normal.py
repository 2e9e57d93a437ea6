import torch

from guides.matrix_normal import MatrixNormalSite
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
