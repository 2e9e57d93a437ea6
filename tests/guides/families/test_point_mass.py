"""The point mass (MAP) family and the Bayesian last layer it makes with guides.AutoMixed."""

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import kl_divergence

import guides
import zoo
from guides.families.point_mass import PointMass, PointMassSite
from tests.zoo.linear_gaussian import correlated_data, exact_posterior, model_for
from zoo.models import BayesianMLP


def test_point_mass_density_sample_and_kl():
    site = PointMassSite(torch.randn(4, 3, dtype=torch.float64), 0.1)
    d = site.distribution()
    assert isinstance(d, PointMass) and d.supports_local_reparameterization
    w = d.rsample((5,))
    assert w.shape == (5, 4, 3) and torch.equal(w[2], site.loc)
    assert torch.equal(d.log_prob(w), torch.zeros(5, dtype=torch.float64))
    w.sum().backward()  # a draw is the parameter itself
    assert torch.equal(site.loc_unconstrained.grad, torch.full((4, 3), 5.0, dtype=torch.float64))
    prior = dist.Normal(torch.tensor(0.2, dtype=torch.float64), 0.7).expand((4, 3)).to_event(2)
    assert torch.allclose(kl_divergence(d, prior), -prior.log_prob(site.loc))
    assert torch.equal(d.variance, torch.zeros(4, 3, dtype=torch.float64))


def test_elbo_is_the_log_joint_at_the_point():
    """-ELBO = -(log p(y | m) + log p(m)): maximising it is MAP."""
    model = BayesianMLP(3, (5,), 2, task="classification")
    guide = guides.AutoMAP(model)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    guide(x, y)
    point = guide.median()
    conditioned = pyro.poutine.trace(pyro.poutine.condition(model, data=point)).get_trace(x, y)
    log_joint = conditioned.log_prob_sum()
    for elbo in (Trace_ELBO(), TraceMeanField_ELBO()):
        assert torch.allclose(elbo.differentiable_loss(model, guide, x, y), -log_joint)


def test_map_fit_finds_the_posterior_mode_of_bayesian_linear_regression():
    x, y = correlated_data(n=500, d=3, corr=0.9, seed=2)
    mean, _ = exact_posterior(x, y)  # Gaussian posterior: mode = mean
    fit = zoo.fit(
        model_for(3),
        "map",
        (x, y),
        num_steps=600,
        batch_size=500,
        lr=0.05,
        run=zoo.Run(progress=False),
    )
    got = torch.cat([fit.guide.median()["fc1.weight"].reshape(-1), fit.guide.median()["fc1.bias"]])
    assert torch.allclose(got, mean, atol=2e-3)


def test_constrained_sites_stay_point_masses():
    model = BayesianMLP(3, (4,), 1, noise="learned")
    x, y = torch.randn(6, 3), torch.randn(6)
    for guide in (guides.AutoMAP(model), guides.AutoMixed(model, {"*": "map"})):
        guide(x, y)
        assert isinstance(guide.site_posterior("noise"), PointMassSite)
        draws = guide.get_posterior("noise").sample((3,))
        assert (draws == draws[0]).all() and (draws > 0).all()
        assert guide.get_posterior("noise").log_prob(draws[0]) == 0  # AutoDelta's convention
    # and a fit learns the noise: finite losses, the MAP noise near the data's 0.3
    x = torch.randn(256, 3)
    y = x[:, 0] + 0.3 * torch.randn(256)
    fit = zoo.fit(
        model,
        "map",
        (x, y),
        num_steps=800,
        batch_size=256,
        lr=0.02,
        run=zoo.Run(progress=False),
    )
    assert 0.2 < fit.guide.median()["noise"] < 0.45


def test_bayesian_last_layer_in_one_call(tmp_path):
    """Train a plain network, then make its last layer Bayesian: MAP body from the net."""
    x = torch.randn(64, 3)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    model = BayesianMLP(3, (8,), 3, task="classification")
    net = torch.nn.Sequential()
    net.add_module("fc1", torch.nn.Linear(3, 8))
    net.add_module("act1", torch.nn.ReLU())
    net.add_module("fc2", torch.nn.Linear(8, 3))
    guide = guides.AutoMixed.last_layer(model, "lowrank", {"rank": 2}, init_module=net)
    guide(x, y)
    kinds = {n: type(guide.site_posterior(n)).__name__ for n in guide.site_names}
    assert kinds == {
        "fc1.weight": "PointMassSite",
        "fc1.bias": "PointMassSite",
        "fc2.weight": "LowRankSite",
        "fc2.bias": "LowRankSite",
    }
    for name, p in net.named_parameters():
        assert torch.equal(guide.median()[name], p.detach())
    fit = zoo.fit(
        model,
        guide,
        (x, y),
        num_steps=20,
        batch_size=16,
        run=zoo.Run(progress=False),
    )
    draws = fit.guide.sample_posterior(5)
    assert not any(d.requires_grad for d in draws.values())
    assert (draws["fc1.weight"] == draws["fc1.weight"][0]).all()  # the body is a point
    assert draws["fc2.weight"].std(0).min() > 0  # the last layer is not
    # a fixed body: its learning rate multiplied by zero
    frozen = guides.AutoMixed.last_layer(model, "lowrank", {"rank": 2}, init_module=net)
    zoo.fit(
        model,
        frozen,
        (x, y),
        num_steps=5,
        optim=zoo.Optim(lr_multipliers={"sites.fc1.*": 0.0}),
        run=zoo.Run(progress=False),
    )
    assert torch.equal(frozen.median()["fc1.weight"], net.fc1.weight.detach())
    assert not torch.equal(frozen.median()["fc2.weight"], net.fc2.weight.detach())
    loaded = zoo.load(fit.save(tmp_path / "bll.pt"))
    assert loaded.guide.spec() == fit.guide.spec()
    assert loaded.guide.spec()["rules"] == [["fc2.*", "lowrank", {"rank": 2}], ["*", "map", {}]]
