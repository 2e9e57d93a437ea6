import pytest
import torch

import guides.kernels
from guides.kernels import LowRankNoise
from guides.lowrank import LowRankSite
from tests.guides.conftest import make_site


@pytest.mark.parametrize("family", ["lowrank", "lowrank_constant"])
def test_off_diagonal_part_has_low_rank(family, shape):
    diagonal = "constant" if family.endswith("constant") else "learned"
    site = make_site(family, shape, site_cls=LowRankSite, options={"rank": 2, "diagonal": diagonal})
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


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("draws", [1, 4])
def test_noise_products_over_column_blocks(monkeypatch, chunks, draws):
    """t = eps2 G, z = eps2 - eps1 G^T, C = I + G G^T and the hand-written backward, computed
    over column blocks (as on a multi-core CPU, with a remainder block), against autograd."""
    monkeypatch.setattr(guides.kernels, "column_chunks", lambda g: chunks)
    gen = torch.Generator().manual_seed(chunks * 10 + draws)
    n, rank = 1001, 4
    g = torch.randn(rank, n, generator=gen, dtype=torch.float64, requires_grad=True)
    eps1 = torch.randn(draws, n, generator=gen, dtype=torch.float64)
    eps2 = torch.randn(draws, rank, generator=gen, dtype=torch.float64)
    got = LowRankNoise.apply(g, eps1, eps2)
    want = (eps2 @ g, eps2 - eps1 @ g.mT, g @ g.mT + torch.eye(rank, dtype=torch.float64))
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    for k in range(4):  # each output alone, then all three
        picked = range(3) if k == 3 else [k]
        loss_got = sum((got[i] * weights[i]).sum() for i in picked)
        loss_want = sum((want[i] * weights[i]).sum() for i in picked)
        (grad_got,) = torch.autograd.grad(loss_got, g, retain_graph=True)
        (grad_want,) = torch.autograd.grad(loss_want, g, retain_graph=True)
        torch.testing.assert_close(grad_got, grad_want, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
