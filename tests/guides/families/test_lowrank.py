import math

import pyro
import pytest
import torch

import guides.lowrank_kernels
import zoo
from guides.families.lowrank import LowRankNormal, LowRankSite
from guides.lowrank_kernels import LowRankDraw, SiteCapacitanceTerms
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


def assert_same_gradients(got, want, weights, picked, inputs, tol):
    """The gradients of ``sum_i <weights_i, got_i>`` over the outputs ``picked`` equal those of
    the same sum over ``want`` (an input that ``want`` does not use gets none or zero)."""
    loss_got = sum((got[i] * weights[i]).sum() for i in picked)
    loss_want = sum((want[i] * weights[i]).sum() for i in picked)
    grads_got = torch.autograd.grad(loss_got, inputs, retain_graph=True, allow_unused=True)
    grads_want = torch.autograd.grad(loss_want, inputs, retain_graph=True, allow_unused=True)
    for x, y in zip(grads_got, grads_want):
        if y is None:
            assert x is None or x.abs().max() == 0, picked
        else:
            torch.testing.assert_close(x, y, rtol=tol, atol=tol, msg=str(picked))


def plain_draw(loc, d, g, eps):
    """``LowRankDraw``'s outputs by autograd-differentiable formulas."""
    n = loc.shape[-1]
    eps1, eps2 = eps[:, :n], eps[:, n:]
    value = loc + d * (eps1 + eps2 @ g)
    z = eps2 - eps1 @ g.mT
    cap = g @ g.mT + torch.eye(g.shape[0], dtype=g.dtype)
    log_d = d.log().sum() * (n // d.shape[-1])
    rest = -0.5 * n * math.log(2 * math.pi) - 0.5 * eps.pow(2).sum(-1) - log_d
    return value, z, cap, rest


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("draws", [1, 4])
@pytest.mark.parametrize("diagonal", ["learned", "constant"])
def test_draw_kernel_equals_autograd(monkeypatch, chunks, draws, diagonal):
    """``LowRankDraw``: the draw, z, C = I + G G^T and the rest of log q, and the hand-written
    backward for every subset of its outputs, against autograd through the plain formulas (the
    Gram product over column blocks, as on a many-core CPU, with a remainder block), float64."""
    monkeypatch.setattr(guides.lowrank_kernels, "column_chunks", lambda g: chunks)
    gen = torch.Generator().manual_seed(chunks * 10 + draws)
    n, rank = 1001, 4
    loc = torch.randn(n, generator=gen, dtype=torch.float64, requires_grad=True)
    rho = torch.rand(n if diagonal == "learned" else 1, generator=gen, dtype=torch.float64)
    d = (rho + 0.5).requires_grad_()
    g = torch.randn(rank, n, generator=gen, dtype=torch.float64, requires_grad=True)
    eps = torch.randn(draws, n + rank, generator=gen, dtype=torch.float64)
    got = LowRankDraw.apply(loc, d, g, eps)
    want = plain_draw(loc, d, g, eps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    subsets = [[k] for k in range(4)] + [[0, 2], [1, 3], [0, 1, 2, 3]]
    for picked in subsets:
        assert_same_gradients(got, want, weights, picked, (loc, d, g), tol=1e-11)


def test_per_site_capacitance_terms_equal_autograd():
    """``SiteCapacitanceTerms``: per site ``(z^T C^{-1} z - log det C) / 2`` and ``log det C``, and
    gradients for any outputs used (some sites' terms unused, as when a log-density is not
    asked for), against ``torch.logdet`` and ``torch.linalg.solve`` through autograd."""
    g = torch.Generator().manual_seed(1)
    k, r = 4, 3
    a = torch.randn(k, r, 5, generator=g, dtype=torch.float64)
    caps = [(torch.eye(r, dtype=torch.float64) + m @ m.mT).requires_grad_() for m in a]
    zs = [torch.randn(r, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(k)]
    got = SiteCapacitanceTerms.apply(*caps, *zs)
    ref_log_det = [torch.logdet(c) for c in caps]
    ref_quad = [z @ torch.linalg.solve(c, z) for c, z in zip(caps, zs)]
    want = [(q - ld) / 2 for ld, q in zip(ref_log_det, ref_quad)] + ref_log_det
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    weights = torch.randn(2 * k, generator=g, dtype=torch.float64)
    for picked in ([0, 1, 2, 3], [1, 3], [4, 5, 6, 7], [0, 5, 6], list(range(2 * k))):
        assert_same_gradients(got, want, weights, picked, caps + zs, tol=1e-10)


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


def test_the_gram_product_is_blocked_from_its_threshold_on_and_equals_one_product():
    """On the CPU a factor of ``GRAM_BLOCKED_FROM`` columns or more is summed in blocks of
    ``GRAM_BLOCK`` (a remainder block after them); the Gram is the one product's."""
    from guides.lowrank_kernels import GRAM_BLOCK, GRAM_BLOCKED_FROM, column_chunks, gram

    gen = torch.Generator().manual_seed(0)
    assert column_chunks(torch.zeros(3, GRAM_BLOCKED_FROM - 1)) == 1
    g = torch.randn(3, GRAM_BLOCKED_FROM + 123, generator=gen, dtype=torch.float64)
    assert column_chunks(g) == GRAM_BLOCKED_FROM // GRAM_BLOCK
    torch.testing.assert_close(gram(g), g @ g.mT, rtol=1e-12, atol=1e-9)
