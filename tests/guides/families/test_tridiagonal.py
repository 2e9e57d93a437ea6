import pytest
import torch

from guides.families.tridiagonal import (
    FreeTridiagonalSite,
    PoschSite,
    TridiagonalNormal,
    posch_factors,
)
from guides.kernels import bidiagonal_solve
from guides.posch_joint import RATIO_TERMS
from tests.guides.conftest import make_site


def paper_recursion(m, tau, rho):
    """Posch & Pilz equations (10)-(13), as a plain loop."""
    n = len(m)
    c = torch.zeros(n - 1, dtype=m.dtype)
    a = torch.zeros(n, dtype=m.dtype)
    prev = torch.zeros((), dtype=m.dtype)
    for i in range(n - 1):
        c[i] = rho * tau**2 * m[i] * m[i + 1] / torch.sqrt(tau**2 * m[i] ** 2 - prev**2)
        a[i] = rho * tau**2 * m[i].abs() * m[i + 1].abs() / c[i]
        prev = c[i]
    a[n - 1] = torch.sqrt(tau**2 * m[n - 1] ** 2 - prev**2)
    return a, c


@pytest.mark.parametrize("rho", [-0.45, -0.2, 0.1, 0.3, 0.49])
def test_closed_form_equals_paper_recursion(rho):
    torch.manual_seed(0)
    m = (0.1 + torch.rand(40, dtype=torch.float64)) * torch.sign(torch.randn(40)).double()
    tau, rho = torch.tensor(0.7, dtype=torch.float64), torch.tensor(rho, dtype=torch.float64)
    a_ref, c_ref = paper_recursion(m, tau, rho)
    a, c = posch_factors(m, tau, rho, min_abs_mean=1e-6)
    # The paper's L may flip column signs; |a|, |c| and the covariance are the same.
    assert torch.allclose(a, a_ref.abs(), rtol=1e-10)
    assert torch.allclose(c.abs(), c_ref.abs(), rtol=1e-10)
    cov = TridiagonalNormal(m, a, c).covariance_matrix
    cov_ref = TridiagonalNormal(m, a_ref, c_ref).covariance_matrix
    assert torch.allclose(cov, cov_ref, rtol=1e-10, atol=1e-14)


def test_covariance_is_tridiagonal_in_row_major_order(shape):
    for family in ("tridiagonal_free", "tridiagonal"):
        cov = make_site(family, shape).distribution().covariance_matrix
        n = cov.shape[0]
        far = torch.ones(n, n, dtype=torch.bool).triu(2) | torch.ones(n, n, dtype=torch.bool).tril(
            -2
        )
        assert cov[far].abs().max() == 0
        assert cov.diagonal(-1).abs().min() > 0


def test_posch_variances_and_correlations(shape):
    site = make_site("tridiagonal", shape)
    d = site.distribution()
    cov = d.covariance_matrix
    m = site.loc.reshape(-1)
    assert torch.allclose(cov.diagonal() / m**2, site.tau.expand(len(m)) ** 2, rtol=1e-10)
    sd = cov.diagonal().sqrt()
    corr = cov.diagonal(-1) / (sd[1:] * sd[:-1])
    assert torch.allclose(corr, site.rho.expand(len(corr)), rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gamma", [-50.0, -10.0, 0.0, 9.99, 50.0])
def test_posch_is_finite_near_the_limits(dtype, gamma):
    """|rho| -> 1/2, long sites, means at and near zero: no NaN, no inf, positive factors."""
    torch.manual_seed(0)
    loc = torch.randn(200_000, dtype=dtype) * 1e-3
    loc[:10] = 0.0
    site = PoschSite(loc.reshape(400, 500), 0.01)
    with torch.no_grad():
        site.gamma.fill_(gamma)
    d = site.distribution()
    assert torch.isfinite(d.diag).all() and (d.diag > 0).all()
    assert torch.isfinite(d.sub).all()
    w = d.rsample()
    lp = d.log_prob(w)
    lp.backward()
    assert torch.isfinite(lp)
    for name, p in site.named_parameters():
        assert torch.isfinite(p.grad).all(), name


def test_limit_of_r_at_rho_one_half():
    """r_k -> (k + 1) / (2 k) as |rho| -> 1/2."""
    m = torch.ones(6, dtype=torch.float64)
    a, _ = posch_factors(m, torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.5 - 1e-9))
    k = torch.arange(1, 7, dtype=torch.float64)
    assert torch.allclose(a.pow(2), (k + 1) / (2 * k), rtol=1e-4)


@pytest.mark.parametrize("gamma", [-10.0, -2.0, 0.5, 10.0])
def test_long_posch_site_equals_its_explicit_factors(gamma):
    """Beyond RATIO_TERMS elements r_k is its limit; the factored PoschNormal equals the
    TridiagonalNormal of the untruncated closed form (every k) in log_prob, entropy, variance."""
    torch.manual_seed(0)
    n = RATIO_TERMS + 2952  # 5000
    loc = torch.randn(n, dtype=torch.float64) * 0.1
    site = PoschSite(loc.reshape(-1, 50), 0.01, init_tau=0.3)
    with torch.no_grad():
        site.gamma.fill_(gamma)
    d = site.distribution()
    tau, rho = site.tau, site.rho
    k = torch.arange(1, n + 1, dtype=torch.float64)
    s = torch.sqrt(1 - 4 * rho**2)
    lam_plus, lam_minus = (1 + s) / 2, (1 - s) / 2
    q = lam_minus / lam_plus
    r = lam_plus * (1 - q ** (k + 1)) / (1 - q**k)  # every k, no truncation
    m_abs = loc.abs().clamp_min(1e-3)
    a, c = tau * m_abs * r.sqrt(), rho * tau * m_abs[1:] / r[:-1].sqrt()
    ref = TridiagonalNormal(loc.reshape(-1, 50), a, c)
    assert torch.allclose(d.diag, a, rtol=1e-12) and torch.allclose(d.sub, c, rtol=1e-12)
    assert torch.allclose(d.variance, ref.variance, rtol=1e-12)
    assert torch.allclose(d.entropy(), ref.entropy(), rtol=1e-12)
    w = d.rsample((2,))
    assert torch.allclose(d.log_prob(w), ref.log_prob(w), rtol=1e-10)


@pytest.mark.parametrize("gamma", [-10.0, -2.0, 0.5, 10.0])
@pytest.mark.parametrize("draws", [(), (2,)])
@pytest.mark.parametrize("terms", ["both", "value", "log_prob"])
def test_posch_sampling_gradients_equal_autograd_of_the_explicit_factors(gamma, draws, terms):
    """The hand-written backward of the Posch sample (head of ratios and the limit beyond it,
    clamped means) equals autograd through TridiagonalNormal(loc, a, c) with the same noise,
    whether the loss uses the draw, its log-density or both."""
    torch.manual_seed(0)
    loc = torch.randn(RATIO_TERMS + 952, dtype=torch.float64) * 0.1
    loc[:5] = torch.tensor([0.0, 1e-4, -1e-4, 2e-3, -0.5], dtype=torch.float64)  # some clamped
    site = PoschSite(loc.reshape(-1, 50), 0.01, init_tau=0.3)
    with torch.no_grad():
        site.gamma.fill_(gamma)
    params = [site.loc, site.delta, site.gamma]
    weights = torch.randn(draws + (60, 50), dtype=torch.float64)

    def loss(d):
        torch.manual_seed(1)
        w = d.rsample(draws)
        log_prob = d.log_prob(w) if terms != "value" else 0.0
        linear = (w * weights).sum((-2, -1)) if terms != "log_prob" else 0.0
        return (log_prob + linear).sum()

    fast = torch.autograd.grad(loss(site.distribution()), params)
    a, c = posch_factors(site.loc.reshape(-1), site.tau, site.rho, 1e-3)
    ref = torch.autograd.grad(loss(TridiagonalNormal(site.loc, a, c)), params)
    for g, g_ref in zip(fast, ref):
        assert torch.allclose(g, g_ref, rtol=1e-8, atol=1e-8)


def test_bidiagonal_solve_matches_dense():
    torch.manual_seed(0)
    n = 37
    diag = 0.5 + torch.rand(n, dtype=torch.float64)
    sub = torch.randn(n - 1, dtype=torch.float64)
    rhs = torch.randn(3, n, dtype=torch.float64)
    dense = torch.diag_embed(diag) + torch.diag_embed(sub, offset=-1)
    expected = torch.linalg.solve_triangular(dense, rhs.T, upper=False).T
    assert torch.allclose(bidiagonal_solve(diag, sub, rhs), expected, rtol=1e-10)


def test_free_parameter_count():
    site = FreeTridiagonalSite(torch.zeros(6, 5), 0.1)
    assert sum(p.numel() for p in site.parameters()) == 30 + 30 + 29


def test_the_batched_ratios_are_each_sites_own():
    """The ratios of several sites in one table are each site's own (sizes below, at and
    above ``RATIO_TERMS``)."""
    from guides.posch_joint import RATIO_TERMS, batched_posch_ratios, posch_ratios

    rho = torch.tensor([0.3, -0.45, 0.0, 0.49], dtype=torch.float64)
    sizes = [5, RATIO_TERMS, RATIO_TERMS + 300, 1]
    like = torch.zeros((), dtype=torch.float64)
    for r, n, (head, lam) in zip(rho, sizes, batched_posch_ratios(rho, sizes, like)):
        one_head, one_lam = posch_ratios(r, n, like)
        assert head.shape == one_head.shape == (min(n, RATIO_TERMS),)
        torch.testing.assert_close(head, one_head, rtol=1e-15, atol=0.0)
        torch.testing.assert_close(lam, one_lam, rtol=1e-15, atol=0.0)
