"""The joint family across sites (guides.AutoJoint) and subnetwork inference on it
(guides.AutoSubnetwork): the guide's log-density against a dense MultivariateNormal, its draws'
moments by Monte Carlo, the exact posterior of a conjugate Bayesian linear regression, the
subnetwork's choice of weights, saves, and what is refused before any work."""

import math

import pytest
import torch
from pyro import poutine

import guides
import zoo
from guides.joint_gaussian import FULL_MAX, JointCovariance
from tests.zoo.linear_gaussian import (
    correlated_data,
    exact_elbo,
    exact_posterior,
    log_evidence,
    model_for,
)
from zoo.inference.objective import loss_context


def every_weight(model) -> int:
    """The scalars of the model's real sites (a learned noise aside)."""
    return sum(math.prod(s) for n, s in model.site_shapes.items() if n != "noise")


def regression_model():
    return zoo.models.BayesianMLP(3, (4,), 1, task="regression", noise="learned")


def data(n=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - x[:, 1] + 0.1 * torch.randn(n, generator=g)


def perturbed(guide, seed=1):
    """Random values for every parameter, so that no check passes by a zero or a symmetry."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        guide.joint.rho.add_(3.0)  # standard deviations near 0.2: a well-conditioned Sigma
    return guide


def dense_covariance(guide):
    """``Sigma`` from the raw parameters, written out independently of the guide's code."""
    cov = guide.joint
    d = torch.nn.functional.softplus(cov.rho.detach().double())
    if guide.rank is None:
        size = len(d)
        unit = torch.eye(size, dtype=torch.float64)
        k = 0
        for i in range(size):  # the strict lower triangle of N, row by row
            for j in range(i):
                unit[i, j] = cov.lower.detach()[k].double() / size
                k += 1
        tril = torch.diag(d) @ unit  # L = diag(d) (I + N), the parameter is K N
        return tril @ tril.T
    factor = torch.diag(d) @ cov.relative.detach().double()  # F = diag(d) G
    return torch.diag(d**2) + factor @ factor.T


CASES = {
    "full, two layers": dict(sites=["fc1.weight", "fc2.*"]),
    "rank 2, masks": dict(
        sites="*", rank=2, masks={"fc1.weight": torch.eye(4, 3, dtype=torch.bool), "fc2.bias": [0]}
    ),
}


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_log_q_of_a_call_is_the_dense_gaussian_of_the_joint_scalars(options):
    """One guide call: ``log q`` summed over its sites is ``N(mu, Sigma)``'s log-density of the
    joint scalars (a dense ``MultivariateNormal``), each joint scalar sits at its place in its
    site, every other scalar at its point, and the entropy is ``log det(2 pi e Sigma) / 2``."""
    x, y = data()
    guide = guides.AutoJoint(regression_model(), rest="diagonal", **options)
    guide(x, y)
    perturbed(guide)
    trace = poutine.trace(guide).get_trace(x, y)
    trace.compute_log_prob()
    latent = next(n for n in trace.nodes if n.endswith("_latent"))
    z = trace.nodes[latent]["value"]
    sigma = dense_covariance(guide)
    mean = torch.cat(
        [
            guide.site_posterior(n).loc.detach().reshape(-1)[guide.site_scalars(n)]
            for n, *_ in guide._joint
        ]
    )
    want = torch.distributions.MultivariateNormal(mean.double(), covariance_matrix=sigma)
    joint_sites = [n for n, *_ in guide._joint]
    log_q = sum(trace.nodes[n]["log_prob_sum"] for n in [latent, *joint_sites])
    torch.testing.assert_close(log_q.double(), want.log_prob(z.double()), rtol=1e-5, atol=1e-3)
    k = len(mean)
    entropy = 0.5 * (k * math.log(2 * math.pi * math.e) + torch.logdet(sigma))
    got = guide.joint_distribution().entropy().double()
    torch.testing.assert_close(got, entropy, rtol=1e-5, atol=1e-4)
    for name in joint_sites:
        value = trace.nodes[name]["value"].reshape(-1)
        rows = guide.site_scalars(name)
        torch.testing.assert_close(value[rows], z[guide.joint_index(name)])
        points = torch.ones_like(value, dtype=torch.bool)
        points[rows] = False
        assert torch.equal(value[points], guide.site_posterior(name).loc.reshape(-1)[points])
    assert trace.nodes["noise"]["fn"].__class__.__name__ != "Delta"  # the rest: diagonal


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_draws_have_the_joint_moments_and_marginals_agree(options):
    """``sample_posterior``: the draws' covariance, across sites, is ``Sigma`` at the joint
    scalars and zero elsewhere (Monte Carlo, 40,000 draws); ``quantiles``, ``median`` and each
    site's marginal (``get_posterior``: variance, covariance block, density) agree with it."""
    x, y = data()
    guide = guides.AutoJoint(regression_model(), **options)
    guide(x, y)
    perturbed(guide)
    draws = guide.sample_posterior(40000)
    sigma = dense_covariance(guide)
    names = [n for n, *_ in guide._joint]
    picked = torch.cat([draws[n].reshape(40000, -1)[:, guide.site_scalars(n)] for n in names], 1)
    torch.testing.assert_close(picked.T.cov().double(), sigma, rtol=0.05, atol=0.02)
    medians = guide.median()
    for name in names:
        marginal = guide.get_posterior(name)
        torch.testing.assert_close(draws[name].var(0), marginal.variance, rtol=0.05, atol=1e-3)
        assert torch.equal(medians[name], guide.site_posterior(name).loc.detach())
        q = guide.quantiles([0.5, 0.8413447])[name]
        torch.testing.assert_close(q[1] - q[0], marginal.variance.sqrt(), rtol=1e-4, atol=1e-6)
        block = marginal.covariance_matrix
        assert block.shape == (draws[name][0].numel(),) * 2
        torch.testing.assert_close(block.diagonal(), marginal.variance.reshape(-1))
        assert torch.isfinite(marginal.log_prob(draws[name][:3])).all()
        moved = draws[name][:1].clone().reshape(-1)
        points = torch.ones_like(moved, dtype=torch.bool)
        points[guide.site_scalars(name)] = False
        if points.any():
            moved[points.nonzero()[0]] += 1.0  # a point-mass scalar off its point
            assert marginal.log_prob(moved.reshape(draws[name][:1].shape)) == -math.inf


D = 4


@pytest.fixture(scope="module")
def conjugate():
    x, y = correlated_data(n=1000, d=D, corr=0.9, seed=1)
    mean, precision = exact_posterior(x, y)
    return x, y, mean, torch.linalg.inv(precision)


def fitted_gaussian(make, x, y):
    model = model_for(D)
    fit = zoo.fit(
        model,
        make(model),
        (x, y),
        num_steps=3000,
        batch_size=1000,
        lr=0.3,  # the off-diagonal parameter is K N: Adam moves a row of N by lr / sqrt(K)
        seed=0,
        optim=zoo.Optim(lr_schedule=lambda step: 0.998**step),
        loss=zoo.Loss(num_particles=16),
        run=zoo.Run(progress=False),
    )
    g = fit.guide
    mean = torch.cat([g.site_posterior(n).loc.reshape(-1) for n in ("fc1.weight", "fc1.bias")])
    return mean.detach(), g.joint.covariance().detach()


@pytest.mark.parametrize(
    "make",
    [
        lambda m: guides.AutoJoint(m, init_scale=0.05),
        lambda m: guides.AutoSubnetwork(m, size=every_weight(m), init_scale=0.05),
    ],
    ids=["joint", "subnetwork of every weight"],
)
@pytest.mark.slow  # quick tier: under three minutes
def test_a_full_joint_reaches_the_exact_posterior_of_a_conjugate_regression(conjugate, make):
    """Bayesian linear regression with correlated inputs: the posterior over the weight and the
    bias (two sites) is one Gaussian with correlations between them, which no per-site family
    holds; the full joint family reaches it (mean, covariance, and an ELBO at the log
    evidence), and so does a subnetwork of every weight."""
    x, y, mean, cov = conjugate
    got_mean, got_cov = fitted_gaussian(make, x, y)
    sd = cov.diagonal().sqrt()
    assert ((got_mean - mean).abs() / sd).max() < 0.1
    q = torch.distributions.MultivariateNormal(got_mean, got_cov)
    exact = torch.distributions.MultivariateNormal(mean, cov)
    kl = torch.distributions.kl_divergence(q, exact).item()
    assert kl < 0.01  # nats: the whitened covariance is the identity to a few percent
    gap = log_evidence(x, y) - exact_elbo(x, y, got_mean, got_cov)
    assert gap == pytest.approx(kl, abs=1e-6)  # ELBO = log evidence - KL(q || posterior)
    diagonal = torch.diag(cov.diagonal())  # the best a per-site family could do is worse:
    assert (
        torch.distributions.kl_divergence(
            torch.distributions.MultivariateNormal(mean, diagonal), exact
        ).item()
        > 10 * kl
    )


@pytest.mark.parametrize("size", [16, 1024])
def test_a_step_on_every_off_diagonal_parameter_moves_a_row_by_lr_over_sqrt_k(size):
    """Adam moves every parameter by about its learning rate: ``lower`` is ``K N``, so the last
    row of ``L`` moves by about ``lr / sqrt(K)`` (times its ``d``), not ``lr sqrt(K - 1)``."""
    lr = 1e-3
    cov = JointCovariance(size, 1.0, None, torch.zeros(1, dtype=torch.float64))
    before = cov.scale_tril().detach()
    with torch.no_grad():
        cov.lower.add_(lr)
    moved = (cov.scale_tril().detach() - before).tril(-1)[-1].norm() / cov.scale()[-1]
    assert moved.item() == pytest.approx(lr * (size - 1) ** 0.5 / size, rel=1e-9)


def test_a_state_dict_saved_before_the_scaled_map_loads_with_the_same_covariance():
    """A state dict of map 1 (``lower`` was ``N`` itself, no module version 2) loads as the same
    ``Sigma``; one of map 2 loads as it is."""
    g = torch.Generator().manual_seed(4)
    cov = JointCovariance(7, 0.2, None, torch.zeros(1, dtype=torch.float64))
    with torch.no_grad():
        cov.lower.copy_(0.3 * torch.randn(cov.lower.shape, generator=g, dtype=torch.float64))
    want = cov.covariance().detach()
    old = cov.state_dict()
    old["lower_unconstrained"] = old["lower_unconstrained"] / 7  # N itself, as map 1 held
    old._metadata[""]["version"] = 1
    loaded = JointCovariance(7, 0.2, None, torch.zeros(1, dtype=torch.float64))
    loaded.load_state_dict(old)
    torch.testing.assert_close(loaded.covariance().detach(), want, rtol=1e-12, atol=1e-15)
    again = JointCovariance(7, 0.2, None, torch.zeros(1, dtype=torch.float64))
    again.load_state_dict(cov.state_dict())
    torch.testing.assert_close(again.covariance().detach(), want, rtol=0, atol=0)


def test_the_subnetwork_chooses_the_largest_weights_or_variances():
    """``select="magnitude"``: the ``size`` largest ``|mean|`` of a trained network;
    :meth:`from_fit` on a diagonal fit: the largest marginal standard deviations, means from
    the fit; a site without a chosen weight is all point masses."""
    x, y = data(64)
    net = regression_model().net
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    guide = guides.AutoSubnetwork(regression_model(), size=5, init_module=net)
    guide(x, y)
    chosen = torch.cat([guide.site_posterior(n).loc.reshape(-1)[guide.site_scalars(n)]
                        for n, *_ in guide._joint]).detach()  # fmt: skip
    assert sorted(chosen.abs().tolist()) == sorted(weights.abs().topk(5).values.tolist())

    diag = zoo.fit(regression_model(), "diagonal", (x, y), num_steps=200,
                   run=zoo.Run(progress=False))  # fmt: skip
    sub = guides.AutoSubnetwork.from_fit(diag, size=7)
    sub(x, y)
    sds = {n: diag.guide.get_posterior(n).variance.sqrt() for n in sub.site_names if n != "noise"}
    flat = torch.cat([s.reshape(-1) for s in sds.values()])
    threshold = flat.topk(7).values.min()
    for name, sd in sds.items():
        rows = sub.site_scalars(name)
        assert (sd.reshape(-1)[rows] >= threshold).all()
        torch.testing.assert_close(sub.site_posterior(name).loc, diag.guide.median()[name])
    assert sum(sub.site_scalars(n).numel() for n in sds) == 7
    assert sub.joint_sites() == [n for n in sds if sub.site_scalars(n).numel()]
    draws = sub.sample_posterior(50)
    for name in sds:
        flat = draws[name].reshape(50, -1)
        varying = (flat != flat[0]).any(0)  # not std > 0: a constant's float std may not be 0
        assert torch.equal(varying.nonzero().reshape(-1), sub.site_scalars(name).sort().values)
    with pytest.raises(ValueError, match="no spread"):
        guides.AutoSubnetwork.from_fit(zoo.fit(regression_model(), "map", (x, y), num_steps=5,
                                               run=zoo.Run(progress=False)), size=3)  # fmt: skip


def test_a_saved_fit_keeps_its_chosen_weights(tmp_path):
    x, y = data(64)
    for guide in (guides.family("subnetwork", size=6),
                  guides.family("subnetwork", size=6, rank=2)):  # fmt: skip
        fit = zoo.fit(regression_model(), guide, (x, y), num_steps=30, run=zoo.Run(progress=False))
        back = zoo.load(fit.save(tmp_path / "sub.pt"))
        for name, *_ in fit.guide._joint:
            assert torch.equal(back.guide.site_scalars(name), fit.guide.site_scalars(name))
        torch.testing.assert_close(
            back.predict(x, num_samples=5, seed=0, progress=False).mean,
            fit.predict(x, num_samples=5, seed=0, progress=False).mean,
        )
    joint = guides.AutoJoint(regression_model(), ["fc2.*"], masks={"fc2.weight": [1, 3]})
    fit = zoo.fit(joint.model, joint, (x, y), num_steps=10, run=zoo.Run(progress=False))
    back = zoo.load(fit.save(tmp_path / "joint.pt"))
    assert back.guide.site_scalars("fc2.weight").tolist() == [1, 3]
    torch.testing.assert_close(back.guide.joint.covariance(), fit.guide.joint.covariance())


def test_what_cannot_run_is_refused_before_any_work():
    model = regression_model()
    x, y = data()
    with pytest.raises(ValueError, match=r"full covariance of 5,000 scalars.*rank="):
        guides.AutoSubnetwork(model, size=5000)
    assert guides.AutoSubnetwork(model, size=5000, rank=4).size == 5000
    with pytest.raises(ValueError, match="size must be an int"):
        guides.AutoSubnetwork(model, size=0)
    with pytest.raises(ValueError, match="select must be"):
        guides.AutoSubnetwork(model, select="variance")
    with pytest.raises(ValueError, match="rank must be"):
        guides.AutoJoint(model, rank=0)
    with pytest.raises(ValueError, match="Unknown guide family 'diagnoal'"):
        guides.AutoJoint(model, rest="diagnoal")
    with pytest.raises(TypeError, match="mask of 'fc1.weight'"):
        guides.AutoJoint(model, masks={"fc1.weight": torch.rand(4, 3)})
    with pytest.raises(ValueError, match=r"patterns \['conv\*'\] match no real site"):
        guides.AutoJoint(model, ["conv*"])(x, y)
    with pytest.raises(ValueError, match="outside the joint set"):
        guides.AutoJoint(model, ["fc2.*"], masks={"fc1.weight": [0]})(x, y)
    with pytest.raises(ValueError, match="indexes past its 12 scalars"):
        guides.AutoJoint(model, masks={"fc1.weight": [12]})(x, y)
    big = zoo.models.BayesianMLP(3, (2000,), 1, task="regression", noise=0.1)
    with pytest.raises(ValueError, match="full covariance of 10,001 scalars"):
        with loss_context():  # zoo's own route: no global param store (the guides above
            guides.AutoJoint(big)(x, y)  # left theirs there, of the small model's shapes)
    assert FULL_MAX == 4096


def test_every_new_option_is_checked_where_it_enters():
    """Issue 59's cases, each a raw Python error, a silent choice or a huge allocation before:
    a mask of the wrong shape, size and masks that disagree, a size above the weights, a rank
    above the scalars (or past memory), non-pattern sites, a composite rest, from_fit's
    arguments."""
    model = regression_model()  # 3 -> 4 -> 1: 21 weights in real sites
    x, y = data()
    with pytest.raises(ValueError, match=r"bool mask of 'fc1.weight' has shape \(12,\)"):
        guides.AutoJoint(model, masks={"fc1.weight": torch.ones(12, dtype=torch.bool)})(x, y)
    with pytest.raises(ValueError, match="masks choose 3 weights and size=20"):
        guides.AutoSubnetwork(model, size=20, select={"fc1.weight": [0, 1, 2]})
    assert guides.AutoSubnetwork(model, select={"fc1.weight": [0, 1, 2]}).size == 3
    with pytest.raises(ValueError, match="size=1000 is more than the model's 21 weights"):
        guides.AutoSubnetwork(model, size=1000, rank=2)(x, y)
    with pytest.raises(ValueError, match="rank=1000000000 is more than the 21 scalars"):
        guides.AutoJoint(model, "*", rank=10**9)(x, y)
    with pytest.raises(ValueError, match="rank=5 is more than the 3 scalars"):
        guides.AutoSubnetwork(model, size=3, rank=5)
    with pytest.raises(ValueError, match="GiB to fit"):  # checked before any allocation
        guides.AutoSubnetwork(model, size=10**8, rank=10**4)
    with pytest.raises(ValueError, match="sites must be an fnmatch pattern"):
        guides.AutoJoint(model, sites=5)
    with pytest.raises(ValueError, match="rest='subnetwork' is a family over several sites"):
        guides.AutoJoint(model, ["fc2.*"], rest="subnetwork")
    with pytest.raises(ValueError, match="from_fit takes a fit"):
        guides.AutoSubnetwork.from_fit("diagonal", 10)
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False))
    with pytest.raises(ValueError, match="size must be an int"):
        guides.AutoSubnetwork.from_fit(fit, "10")
    with pytest.raises(ValueError, match="size=50 is more than the fit's 21 weights"):
        guides.AutoSubnetwork.from_fit(fit, 50)
    assert guides.AutoSubnetwork.from_fit(fit, 5).size == 5
