"""The block-diagonal family: its structure and its parameter count (the shared distribution
tests in test_distributions.py run it against a dense MultivariateNormal)."""

import math

import pytest
import torch
from torch.distributions import Normal

from guides.block_diagonal import BlockDiagonalNormal, BlockDiagonalSite
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
