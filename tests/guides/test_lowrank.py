import pytest
import torch

from guides.lowrank import LowRankSite
from tests.guides.conftest import make_site


@pytest.mark.parametrize("family", ["lowrank", "lowrank_constant"])
def test_off_diagonal_part_has_low_rank(family, shape):
    site = make_site(family, shape)
    d = site.distribution()
    low = d.covariance_matrix - torch.diag_embed(d.diag_scale.pow(2))
    assert torch.linalg.matrix_rank(low) <= 2


def test_constant_diagonal_is_one_value_per_site():
    site = LowRankSite(torch.zeros(6, 5), 0.1, rank=3, diagonal="constant")
    assert site.diag_rho.numel() == 1
    d = site.distribution()
    assert torch.allclose(d.diag_scale, d.diag_scale[0].expand(30))
    assert sum(p.numel() for p in site.parameters()) == 30 + 1 + 90


def test_initial_marginal_scale():
    d = LowRankSite(torch.zeros(20, 30), 0.05, rank=4).distribution()
    assert abs(d.variance.sqrt().mean().item() - 0.05) < 0.005


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="diagonal"):
        LowRankSite(torch.zeros(3), 0.1, diagonal="free")
    with pytest.raises(ValueError, match="rank"):
        LowRankSite(torch.zeros(3), 0.1, rank=0)
