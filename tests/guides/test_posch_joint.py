"""Every Posch site drawn in one pass (``guides.posch_joint``): against each site's explicit
bidiagonal factor, its exact density (a bidiagonal solve, and a dense ``MultivariateNormal``
where small) and autograd through them, with the same noise."""

import pyro
import pytest
import torch

import guides
import zoo
from guides.families.tridiagonal import PoschSite, TridiagonalNormal, posch_factors
from guides.posch_joint import RATIO_TERMS, PoschLayout, posch_joint_draw, posch_rho

#: Site shapes below, at and beyond RATIO_TERMS, and single elements.
SHAPES = [(5,), (1,), (RATIO_TERMS,), (4, 3), (RATIO_TERMS + 300,), (1, 1)]


def make_sites(gammas, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    sites = []
    for shape, gamma in zip(SHAPES, gammas):
        loc = torch.randn(shape, generator=g, dtype=dtype) * 0.1
        loc.reshape(-1)[:2] = torch.tensor([1e-5, -0.4], dtype=dtype)[: loc.numel()]  # clamped
        site = PoschSite(loc, 0.01, init_tau=0.2 + 0.1 * len(sites))
        with torch.no_grad():
            site.gamma.fill_(gamma)
        sites.append(site)
    return sites


def explicit(site, eps):
    """The site's draw and exact density through ``TridiagonalNormal(loc, a, c)``."""
    a, c = posch_factors(site.loc.reshape(-1), site.tau, site.rho, site.min_abs_mean)
    value = site.loc.reshape(-1) + a * eps
    value = torch.cat([value[:1], value[1:] + c * eps[:-1]]).reshape(site.loc.shape)
    return value, TridiagonalNormal(site.loc, a, c).log_prob(value)


def joint(sites, eps):
    layout = PoschLayout([s.loc.numel() for s in sites], sites[0].loc)
    tau = torch.nn.functional.softplus(torch.stack([s.delta for s in sites]))
    rho = posch_rho(torch.stack([s.gamma for s in sites]))
    values, noises, log_q, _, _ = posch_joint_draw(
        [s.loc for s in sites], tau, rho, layout, 1e-3, eps
    )
    return values, noises, log_q


@pytest.mark.parametrize("gammas", [[0.0] * 6, [-10.0, 2.0, 10.0, -2.0, 0.5, 10.0]])
def test_the_joint_draw_is_each_sites_draw_and_density(gammas):
    sites = make_sites(gammas)
    eps = torch.randn(sum(s.loc.numel() for s in sites), dtype=torch.float64)
    values, noises, log_q = joint(sites, eps)
    for i, (site, eps_s) in enumerate(zip(sites, eps.split([s.loc.numel() for s in sites]))):
        value, log_prob = explicit(site, eps_s)
        assert values[i].shape == site.loc.shape
        torch.testing.assert_close(noises[i], eps_s, rtol=0, atol=0)
        torch.testing.assert_close(values[i], value, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(log_q[i], log_prob, rtol=1e-10, atol=1e-9)
        if site.loc.numel() < 50:  # and against a dense covariance
            cov = TridiagonalNormal(
                site.loc, *posch_factors(site.loc.reshape(-1), site.tau, site.rho, 1e-3)
            ).covariance_matrix
            mvn = torch.distributions.MultivariateNormal(site.loc.reshape(-1), cov)
            torch.testing.assert_close(
                log_q[i], mvn.log_prob(value.reshape(-1)), rtol=1e-10, atol=1e-9
            )


@pytest.mark.parametrize("terms", ["both", "value", "log_prob"])
def test_the_joint_draw_has_the_gradients_of_each_sites_exact_density(terms):
    """The same total derivative as the explicit factors' draw and exact density (whose
    Mahalanobis norm at its own draw is ``|eps|^2`` whatever the parameters)."""
    sites = make_sites([-10.0, 2.0, 10.0, -2.0, 0.5, 0.0])
    params = [p for s in sites for p in (s.loc, s.delta, s.gamma)]
    eps = torch.randn(sum(s.loc.numel() for s in sites), dtype=torch.float64)
    weights = [torch.randn(s.loc.shape, dtype=torch.float64) for s in sites]

    def loss(values, log_q):
        linear = sum((v * w).sum() for v, w in zip(values, weights))
        log_prob = sum(log_q)
        return {"both": linear + log_prob, "value": linear, "log_prob": log_prob}[terms]

    values, _, log_q = joint(sites, eps)
    fast = torch.autograd.grad(loss(values, list(log_q)), params)
    pairs = [explicit(s, e) for s, e in zip(sites, eps.split([s.loc.numel() for s in sites]))]
    ref = torch.autograd.grad(loss(*zip(*pairs)), params)
    for g, g_ref in zip(fast, ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-9)


def test_the_layout_reads_no_ratio_beyond_a_site():
    """Each element reads its own site's ``r_j`` (the limit beyond ``RATIO_TERMS``) and the
    previous element's, a site's first element the appended zero."""
    sizes = [3, 1, RATIO_TERMS + 2]
    layout = PoschLayout(sizes, torch.zeros(()))
    w = RATIO_TERMS + 1
    expected = [0, 1, 2, w, 2 * w + 0] + [2 * w + j for j in range(1, RATIO_TERMS)]
    expected += [2 * w + RATIO_TERMS] * 2
    assert layout.ratio_index.tolist() == expected
    assert layout.previous_index[[0, 3, 4]].tolist() == [3 * w] * 3
    assert layout.previous_index[[1, 2, 5]].tolist() == [0, 1, 2 * w]
    assert layout.ratio_weight.sum(-1).tolist() == [float(n) for n in sizes]


def test_the_guide_draws_its_posch_sites_jointly_and_leaves_nothing_behind():
    """``AutoTridiagonal.forward``: each site's value and log-density are its own distribution's
    for the noise it reports, and no shared values stay on a site after the call."""
    model = zoo.models.BayesianMLP(3, (8,), 2, task="regression")
    guide = guides.AutoTridiagonal(model, init_rho=0.2)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    guide(x, y)
    with pyro.poutine.trace() as tracer:
        guide(x, y)
    names = [n for n in guide.site_names if isinstance(guide.site_posterior(n), PoschSite)]
    sites = [guide.site_posterior(n) for n in names]
    assert len(sites) > 1 and all(s.shared is None for s in sites)
    for name, site in zip(names, sites):
        node = tracer.trace.nodes[name]
        value, eps = node["value"], node["fn"]._cache[1]
        expected, log_prob = explicit(site, eps)
        torch.testing.assert_close(value, expected)
        torch.testing.assert_close(node["fn"].log_prob(value), log_prob, rtol=1e-5, atol=1e-4)
        # and a distribution built outside the joint draw still draws on its own
        assert guide.get_posterior(name).rsample().shape == site.loc.shape


def test_the_cpu_draws_large_networks_site_by_site():
    """On the CPU a gather over the weights costs several plain passes, so the joint draw is
    used below ``CPU_JOINT_ELEMENTS_PER_SITE`` weights per site only (benchmarks/posch_joint.py);
    a GPU always uses it."""
    from guides.posch_joint import CPU_JOINT_ELEMENTS_PER_SITE as PER_SITE
    from guides.posch_joint import joint_draw_pays, share_posch_work

    assert joint_draw_pays(10**7, 2, torch.device("cuda"))
    assert not joint_draw_pays(2 * PER_SITE, 2, torch.device("cpu"))
    for total, joint in [(2 * PER_SITE - 2, True), (2 * PER_SITE, False)]:
        sites = [PoschSite(torch.randn(total // 2) * 0.1, 0.01) for _ in range(2)]
        share_posch_work(sites, 1e-3, {})
        assert all((s.shared[3] is not None) == joint for s in sites)
        d = sites[0].distribution()
        w = d.rsample()
        assert (d._log_q is not None) == joint and torch.isfinite(d.log_prob(w))


def test_a_seeded_guide_draws_the_same_weights_jointly_and_site_by_site():
    """The joint draw takes its noise site by site, so a seeded fit gives the same draws as
    before it (up to rounding)."""
    from guides.posch_joint import share_posch_work

    model = zoo.models.BayesianMLP(5, (7, 6), 3, task="classification")
    guide = guides.AutoTridiagonal(model)
    x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
    guide(x, y)
    sites = [guide.site_posterior(n) for n in guide.site_names]
    assert all(isinstance(s, PoschSite) for s in sites)
    draws = {}
    for joint in (True, False):
        torch.manual_seed(5)
        share_posch_work(sites, 1e-3, {}, joint=joint)
        try:
            dists = [s.distribution() for s in sites]
            draws[joint] = [(d.rsample(), d) for d in dists]
            draws[joint] = [(w, d.log_prob(w)) for w, d in draws[joint]]
        finally:
            for s in sites:
                s.shared = None
    for (w, lq), (w0, lq0) in zip(draws[True], draws[False]):
        torch.testing.assert_close(w, w0, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(lq, lq0, rtol=1e-6, atol=1e-4)


def test_no_joint_draw_under_vectorised_particles():
    """Under an enclosing plate (``Trace_ELBO(vectorize_particles=True)``) every site draws a
    batch, which the joint draw cannot serve: it is not computed, and the draws stay right."""
    from unittest import mock

    import guides.posch_joint as posch_joint

    model = zoo.models.BayesianMLP(3, (8,), 2, task="regression")
    guide = guides.AutoTridiagonal(model)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    guide(x, y)
    with mock.patch.object(
        posch_joint, "posch_joint_draw", wraps=posch_joint.posch_joint_draw
    ) as spy:
        guide(x, y)
        assert spy.call_count == 1  # no plate: the joint draw serves every site
        with pyro.plate("particles", 3, dim=-3), pyro.poutine.trace() as tracer:
            guide(x, y)
        assert spy.call_count == 1
    for name in guide.site_names:
        node = tracer.trace.nodes[name]
        shape = guide.site_posterior(name).loc.shape
        value = node["value"]
        assert value.shape[0] == 3 and value.shape[value.dim() - len(shape) :] == shape
        assert not torch.equal(value[0], value[1])  # three draws, not one repeated
        assert torch.isfinite(node["fn"].log_prob(node["value"])).all()
