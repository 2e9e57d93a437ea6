import pyro
import pytest
import torch

import guides.kernels
import zoo
from guides.kernels import LowRankNoise
from guides.lowrank import LowRankNormal, LowRankSite
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


def test_capacitance_terms_equal_autograd_through_a_factorisation():
    """``CapacitanceTerms`` against ``torch.logdet`` and ``torch.linalg.solve`` (values and
    gradients through autograd), on a batch of positive definite matrices, float64."""
    from guides.kernels import CapacitanceTerms

    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 4, 6, generator=g, dtype=torch.float64)
    cap = (torch.eye(4, dtype=torch.float64) + a @ a.mT).requires_grad_()
    z = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    log_det, quad = CapacitanceTerms.apply(cap, z)
    ref_log_det = torch.logdet(cap)
    ref_quad = (z * torch.linalg.solve(cap, z.unsqueeze(-1)).squeeze(-1)).sum(-1)
    torch.testing.assert_close(log_det, ref_log_det, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(quad, ref_quad, rtol=1e-12, atol=1e-12)
    for terms in ([0], [1], [0, 1]):
        fast = sum((weights[i] * (log_det, quad)[i]).sum() for i in terms)
        ref = sum((weights[i] * (ref_log_det, ref_quad)[i]).sum() for i in terms)
        got = torch.autograd.grad(fast, (cap, z), retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(ref, (cap, z), retain_graph=True, allow_unused=True)
        for x, y in zip(got, want):
            if y is None:  # z does not enter log det C
                assert x is None or x.abs().max() == 0
            else:
                torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_the_guide_computes_its_sites_capacitance_terms_together():
    """``AutoLowRank.forward`` evaluates every site's terms in one batched call (sites of two
    ranks here: a bias of 3 elements caps the rank at 3): the same draws, log-densities and
    gradients as each site on its own, and nothing shared left on a site after the call."""
    model = zoo.models.BayesianMLP(4, (6,), 3, task="regression")
    guide = guides.AutoLowRank(model, rank=4)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    guide(x, y)
    params = list(guide.parameters())

    def total(pairs):
        return sum(d.log_prob(v).sum() + (v * v.detach()).sum() for d, v in pairs)

    pyro.set_rng_seed(3)
    with pyro.poutine.trace() as tracer:
        guide(x, y)
    nodes = [tracer.trace.nodes[n] for n in guide.site_names]
    joint = [(node["fn"], node["value"]) for node in nodes]
    batched = [d for d, _ in joint if isinstance(d, LowRankNormal)]
    assert all(d._key is not None for d in batched) and {d.rank for d in batched} == {3, 4}
    assert all(getattr(guide.site_posterior(n), "shared", None) is None for n in guide.site_names)
    pyro.set_rng_seed(3)
    alone = []
    for name in guide.site_names:
        d = guide.get_posterior(name)
        alone.append((d, d.rsample()))
    for (d, v), (d0, v0) in zip(joint, alone):
        torch.testing.assert_close(v, v0, rtol=0, atol=0)
        torch.testing.assert_close(d.log_prob(v), d0.log_prob(v0), rtol=1e-5, atol=1e-5)
        if not isinstance(d0, LowRankNormal):  # the constrained noise scale
            continue
        dense = torch.distributions.MultivariateNormal(d0.mean.reshape(-1), d0.covariance_matrix)
        torch.testing.assert_close(
            d.log_prob(v), dense.log_prob(v.reshape(-1)), rtol=1e-4, atol=1e-4
        )
    got = torch.autograd.grad(total(joint), params, allow_unused=True)
    want = torch.autograd.grad(total(alone), params, allow_unused=True)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
