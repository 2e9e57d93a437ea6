"""Properties every family's distribution shares, checked against a dense MultivariateNormal.

Every test takes ``make`` (``make(shape)`` -> a site with random parameters) from
``tests/guides/conftest.py``, one case per registered family and variant; a module that defines
a family of its own imports these tests and overrides ``make``."""

import math

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence


def dense(d):
    return MultivariateNormal(d.mean.reshape(-1), covariance_matrix=d.covariance_matrix)


def test_log_prob_matches_dense_mvn(make, shape):
    d = make(shape).distribution()
    ref = dense(d)
    torch.manual_seed(1)
    points = d.mean + 0.7 * torch.randn((7,) + tuple(shape), dtype=torch.float64)
    expected = ref.log_prob(points.reshape(7, -1))
    assert torch.allclose(d.log_prob(points), expected, rtol=1e-9, atol=1e-9)
    drawn = d.rsample((5,))  # the cached shortcut path
    assert torch.allclose(d.log_prob(drawn), ref.log_prob(drawn.reshape(5, -1)), atol=1e-9)


def test_moments_and_entropy_match_dense(make, shape):
    d = make(shape).distribution()
    cov = d.covariance_matrix
    assert torch.allclose(d.variance.reshape(-1), cov.diagonal(), rtol=1e-12)
    assert torch.allclose(cov, cov.mT)
    assert torch.linalg.eigvalsh(cov).min() > 0
    assert torch.allclose(d.entropy(), dense(d).entropy(), rtol=1e-10)


def test_empirical_covariance_of_samples(make, shape):
    d = make(shape).distribution()
    torch.manual_seed(2)
    samples = d.rsample((50_000,)).reshape(50_000, -1)
    emp = torch.cov(samples.T)
    cov = d.covariance_matrix
    # Monte Carlo sd of a covariance entry is about var * sqrt(2 / 50000) = 0.0063 var.
    assert (emp - cov).abs().max() < 0.04 * cov.diagonal().max()
    assert (samples.mean(0) - d.mean.reshape(-1)).abs().max() < 0.03 * cov.diagonal().max().sqrt()


def test_closed_form_kl_matches_monte_carlo(make, shape):
    d = make(shape).distribution()
    prior = dist.Normal(torch.tensor(0.1, dtype=torch.float64), 0.7).expand(shape).to_event(2)
    kl = kl_divergence(d, prior)
    torch.manual_seed(3)
    w = d.rsample((40_000,))
    ratio = d.log_prob(w) - prior.log_prob(w)
    stderr = ratio.std() / math.sqrt(len(ratio))
    assert abs(kl - ratio.mean()) < 4 * stderr
    # and against the dense reference
    ref = MultivariateNormal(
        torch.full((d.num_elements,), 0.1, dtype=torch.float64),
        covariance_matrix=0.49 * torch.eye(d.num_elements, dtype=torch.float64),
    )
    assert torch.allclose(kl, kl_divergence(dense(d), ref), rtol=1e-9)


def test_kl_broadcasts_over_particles(make):
    d = make((4, 3)).distribution().expand((5,))
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0).expand((5, 4, 3)).to_event(2)
    kl = kl_divergence(d, prior)
    assert kl.shape == (5,)
    assert torch.allclose(kl, kl[0].expand(5))
    assert d.rsample().shape == (5, 4, 3)
    assert d.log_prob(d.rsample()).shape == (5,)


def test_gradients_reach_every_parameter(make, shape):
    site = make(shape)
    d = site.distribution()
    w = d.rsample((3,))
    torch.manual_seed(4)
    (w * torch.randn_like(w)).sum().backward()
    for name, p in site.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("draws", [(), (3,)], ids=["one draw", "three draws"])
def test_log_prob_of_own_sample_has_the_exact_gradient(make, shape, draws):
    """The noise-based log_prob of a value just drawn is the same function of the parameters
    as the exact formula: equal values and equal total derivatives (one draw is where a family
    may reuse terms of the draw, e.g. the matrix normal's log-determinant)."""
    site = make(shape)
    params = [p for _, p in site.named_parameters()]

    def grads(shortcut: bool):
        torch.manual_seed(5)
        d = site.distribution()
        w = d.rsample(draws)
        lp = d.log_prob(w if shortcut else w.clone())  # a clone is not the cached value
        return lp, torch.autograd.grad(lp.sum(), params, allow_unused=True, materialize_grads=True)

    lp_fast, g_fast = grads(True)
    lp_exact, g_exact = grads(False)
    assert torch.allclose(lp_fast, lp_exact, atol=1e-10)
    for a, b in zip(g_fast, g_exact):
        assert torch.allclose(a, b, atol=1e-8)


def test_log_prob_at_the_mean_tensor_is_exact(make, shape):
    d = make(shape).distribution()
    m = d.mean_value()
    assert torch.allclose(d.log_prob(m), dense(d).log_prob(m.reshape(-1)), atol=1e-9)


def test_squared_norm_value_and_gradients():
    from guides.kernels import squared_norm

    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(squared_norm(x), x.pow(2).sum(-1))
    assert torch.autograd.gradcheck(squared_norm, (x,))
    assert torch.autograd.gradgradcheck(squared_norm, (x,))


def test_noise_squared_norm_is_one_dot_for_a_vector():
    from guides.kernels import noise_squared_norm

    x = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(noise_squared_norm(x), x.pow(2).sum(-1))
    assert torch.allclose(noise_squared_norm(x[0]), x[0].pow(2).sum())
    v = x[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        noise_squared_norm(v)
    assert [e.name for e in prof.events() if e.cpu_parent is None] == ["aten::dot"]
    w = x[0].clone().requires_grad_()  # a tensor with a gradient takes the differentiable path
    assert torch.autograd.gradcheck(noise_squared_norm, (w,))


def test_the_isotropic_kl_shortcut_equals_the_per_element_sum(make, shape):
    """An expanded scalar prior takes the two-pass KL (guides.gaussian._isotropic_kl); the same
    prior written out per element takes the per-element sum: equal values and gradients."""
    site = make(shape)
    loc, scale = torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    expanded = dist.Normal(loc, scale).expand(shape).to_event(2)
    written = dist.Normal(loc.expand(shape).clone(), scale.expand(shape).clone()).to_event(2)
    results = []
    for prior in (expanded, written):
        site.zero_grad()
        kl = kl_divergence(site.distribution(), prior)
        kl.backward()
        results.append((kl.detach(), [p.grad.clone() for p in site.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-10)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
