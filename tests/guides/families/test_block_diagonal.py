"""The block-diagonal family: its structure and its parameter count (the shared distribution
tests in test_distributions.py run it against a dense MultivariateNormal)."""

import math

import pytest
import torch
from torch.distributions import Normal

from guides.families.block_diagonal import BlockDiagonalNormal, BlockDiagonalSite
from tests.guides.conftest import make_site


def random_site(shape, block_size, seed=0):
    return make_site(None, shape, seed, BlockDiagonalSite, {"block_size": block_size})


@pytest.mark.parametrize("shape, block", [((6, 5), 4), ((7, 3), 5), ((2, 3, 2, 2), 8)])
def test_covariance_is_zero_across_blocks_and_full_within(shape, block):
    d = random_site(shape, block).distribution()
    n = math.prod(shape)
    cov = d.covariance_matrix
    which = torch.arange(n) // block
    same = which[:, None] == which[None, :]
    assert (cov[~same] == 0).all()
    # within a block every pair is correlated (random factors)
    assert (cov[same].abs() > 0).all()
    # and the empirical covariance of draws agrees, cross-block entries included
    torch.manual_seed(1)
    draws = d.rsample((40_000,)).reshape(40_000, n)
    emp = torch.cov(draws.T)
    assert (emp - cov).abs().max() < 0.05 * cov.diagonal().max()


def test_last_block_is_the_leading_part_of_a_padded_block():
    """n = 7, b = 4: the second block holds 3 weights, and their covariance is the leading 3 x 3
    part of L L^T (padding rows are never read)."""
    site = random_site((7,), 4)
    d = site.distribution()
    tril = site.factor()
    assert tril.shape == (2, 4, 4)
    full = tril[1] @ tril[1].T
    assert torch.allclose(d.covariance_matrix[4:, 4:], full[:3, :3])
    # log det and the solve use the real weights only
    torch.manual_seed(2)
    x = torch.randn(5, 7, dtype=torch.float64)
    dense = torch.distributions.MultivariateNormal(d.mean, covariance_matrix=d.covariance_matrix)
    assert torch.allclose(d.log_prob(x), dense.log_prob(x), atol=1e-9)


def test_parameter_count_is_order_n_b():
    n, b = 1000, 16
    site = BlockDiagonalSite(torch.zeros(40, 25), 0.1, block_size=b)
    count = sum(p.numel() for p in site.parameters())
    assert count == n + math.ceil(n / b) * (b + b * (b - 1) // 2)


def test_block_size_one_is_the_diagonal_family():
    site = random_site((4, 3), 1)
    d = site.distribution()
    scale = d.variance.sqrt()
    torch.manual_seed(3)
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    expected = Normal(d.mean, scale).log_prob(x).sum((-2, -1))
    assert torch.allclose(d.log_prob(x), expected)


def test_a_site_smaller_than_a_block_is_one_full_block():
    site = BlockDiagonalSite(torch.zeros(2, 3), 0.1, block_size=16)
    assert site.factor().shape == (1, 6, 6)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "4"])
def test_block_size_is_checked(bad):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        BlockDiagonalSite(torch.zeros(3, 3), 0.1, block_size=bad)


def test_distribution_checks_the_factor_shapes():
    with pytest.raises(ValueError, match="diag must have shape"):
        BlockDiagonalNormal(torch.zeros(10), torch.ones(2, 4), torch.zeros(2, 5))


def test_a_bad_block_size_is_refused_when_the_guide_is_built():
    from guides import AutoBlockDiagonal, AutoMixed
    from zoo.models import BayesianMLP

    model = BayesianMLP(3, (4,), 1)
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        AutoBlockDiagonal(model, block_size=0)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        AutoMixed(model, {"*": ("block_diagonal", {"block_size": -1})})


def _perturbed_site(seed=3):
    g = torch.Generator().manual_seed(seed)
    site = BlockDiagonalSite(torch.randn(5, 7, generator=g, dtype=torch.float64), 0.01, 4)
    with torch.no_grad():
        site.diag_rho_unconstrained.add_(torch.randn(site.diag_rho.shape, generator=g))
        site.lower_unconstrained.add_(torch.randn(site.lower.shape, generator=g))
    return site


def test_the_lower_entries_are_relative_to_their_rows_diagonal():
    """L_k = diag(d_k) (I + U_k / sqrt(b)): each row of the factor is its diagonal entry times a
    unit-diagonal row, so the correlations do not depend on the standard deviations."""
    site = _perturbed_site()
    b = site.block_size
    d = torch.nn.functional.softplus(site.diag_rho).detach()
    unit = torch.eye(b, dtype=torch.float64).repeat(len(d), 1, 1)
    rows, cols = torch.tril_indices(b, b, -1)
    unit[:, rows, cols] = site.lower.detach() / b**0.5
    torch.testing.assert_close(site.factor().detach(), d.unsqueeze(-1) * unit)
    # the optimiser's step on ``lower`` moves a correlation, not an absolute covariance entry:
    # the same raw entries at a thousandth of the scales give the same correlations
    small = _perturbed_site()
    with torch.no_grad():
        small.diag_rho_unconstrained.copy_(
            torch.log(torch.expm1(torch.nn.functional.softplus(small.diag_rho) / 1000))
        )

    def correlation(s):
        cov = s.distribution().covariance_matrix.detach()
        sd = cov.diagonal().sqrt()
        return cov / sd[:, None] / sd[None, :]

    torch.testing.assert_close(correlation(small), correlation(site))


def test_the_unit_form_is_the_same_distribution_as_the_absolute_one():
    """``unit=True`` (``L_k = diag(d_k) (I + U_k)``, what the site builds) against the absolute
    entries ``d_ki U_k[ij]``: the same factor, draws, variance and density."""
    g = torch.Generator().manual_seed(5)
    loc = torch.randn(11, generator=g, dtype=torch.float64)
    diag = torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.1
    unit = torch.randn(3, 6, generator=g, dtype=torch.float64)
    rows, _ = torch.tril_indices(4, 4, -1)
    relative = BlockDiagonalNormal(loc, diag, unit, unit=True)
    absolute = BlockDiagonalNormal(loc, diag, unit * diag[:, rows])
    torch.testing.assert_close(relative.tril, absolute.tril)
    eps = torch.randn(5, 12, generator=g, dtype=torch.float64)
    torch.testing.assert_close(relative._deviation(eps), absolute._deviation(eps))
    torch.testing.assert_close(relative.variance, absolute.variance)
    x = torch.randn(5, 11, generator=g, dtype=torch.float64)
    torch.testing.assert_close(relative.log_prob(x), absolute.log_prob(x))


@pytest.mark.parametrize("route", ["pickle", "state_dict"])
def test_sites_saved_under_the_absolute_map_load_with_the_same_factor(route):
    """A site saved before the entries were relative to their row (map 1: ``L_ij = lower_ij /
    sqrt(b)``) loads with the same factor, by its state dict's module version or, pickled,
    by its missing ``lower_map``."""
    import pickle

    site = _perturbed_site()
    want = site.factor().detach()

    def reload(saved, version=None):
        if route == "pickle":
            return pickle.loads(pickle.dumps(saved))
        state = saved.state_dict()
        if version is not None:
            state._metadata[""]["version"] = version
        fresh = BlockDiagonalSite(torch.zeros(5, 7, dtype=torch.float64), 0.5, 4)
        fresh.load_state_dict(state)
        return fresh

    torch.testing.assert_close(reload(site).factor().detach(), want, rtol=0, atol=0)
    b = site.block_size
    with torch.no_grad():  # what map 1 stored for the same factor
        rows, cols = torch.tril_indices(b, b, -1)
        site.lower_unconstrained.copy_(want[:, rows, cols] * b**0.5)
    del site.lower_map
    old = reload(site, version=1)
    assert old.lower_map == BlockDiagonalSite.LOWER_MAP
    torch.testing.assert_close(old.factor().detach(), want, rtol=1e-12, atol=1e-15)
    assert isinstance(old.lower_unconstrained, torch.nn.Parameter)
    torch.testing.assert_close(old.distribution().sample((2,)).shape, torch.Size((2, 5, 7)))
