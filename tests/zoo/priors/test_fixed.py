import math

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import kl_divergence

from tests.guides.conftest import FAMILIES, make_site
from zoo.priors import IsotropicNormal


def test_isotropic_normal_is_the_factorised_normal():
    loc, scale = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    iso = IsotropicNormal(loc, scale, (4, 3))
    ref = dist.Normal(loc, scale).expand((4, 3)).to_event(2)
    w = torch.randn(5, 4, 3, dtype=torch.float64)
    assert torch.allclose(iso.log_prob(w), ref.log_prob(w))
    assert iso.expand((5,)).log_prob(w).shape == (5,)
    draws = iso.sample((20_000,))
    assert abs(draws.std().item() - 0.7) < 0.01 and abs(draws.mean().item() - 0.3) < 0.01


@pytest.mark.parametrize("family", list(FAMILIES))
def test_closed_form_kl_to_the_isotropic_prior(family):
    q = make_site(family, (4, 3)).distribution()
    loc, scale = torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    iso = IsotropicNormal(loc, scale, (4, 3))
    ref = dist.Normal(loc, scale).expand((4, 3)).to_event(2)
    assert torch.allclose(kl_divergence(q, iso), kl_divergence(q, ref), rtol=1e-10)
    particles = q.expand((3,))
    assert kl_divergence(particles, iso.expand((3,))).shape == (3,)


def test_scale_mixture_prior_fits_with_every_elbo():
    """The prior need not be reparameterisable (only the guide is sampled); it has no closed-form
    KL, so elbo="meanfield" uses the Monte Carlo term and gives the same estimate."""
    import zoo
    from zoo.priors import ScaleMixturePrior

    x = torch.randn(64, 5)
    y = (x[:, 0] > 0).long()
    model = zoo.models.BayesianMLP(5, (8,), 2, task="classification", prior=ScaleMixturePrior())
    losses = {}
    for elbo in ("trace", "meanfield"):
        fit = zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=20,
            run=zoo.Run(progress=False),
            loss=zoo.Loss(elbo=elbo),
        )
        losses[elbo] = fit.losses
        assert all(math.isfinite(v) for v in fit.losses)
    assert losses["trace"] == pytest.approx(losses["meanfield"], rel=1e-5)


def test_a_model_without_a_prior_gets_its_tasks_default():
    from zoo.models import BayesianMLP, LeNet5
    from zoo.models.likelihoods import Gaussian
    from zoo.priors import REGRESSION_GAIN, LayerwiseNormalPrior, NormalPrior, resolve_prior

    regression = BayesianMLP(3, (4,), 1)
    assert type(regression.prior) is LayerwiseNormalPrior
    assert float(regression.prior.gain) == pytest.approx(REGRESSION_GAIN)  # a float32 buffer
    assert isinstance(regression.likelihood, Gaussian) and regression.likelihood.learned
    # N(0, gain^2 / fan_in): the hidden layer's weights have fan-in 3, the output's 4
    std = regression.prior.distribution((4, 3), 3).stddev
    assert torch.allclose(std, torch.full((4, 3), math.sqrt(2 / 3)))
    for model in (BayesianMLP(3, (4,), 2, task="classification"), LeNet5()):
        assert type(model.prior) is NormalPrior and float(model.prior.scale) == 1.0
    # a given prior is kept whatever the task, and the default is saved as a plain spec
    assert float(BayesianMLP(3, (4,), 1, prior=2.0).prior.scale) == 2.0
    spec = regression.spec()["args"]["prior"]
    assert spec["class"] == "LayerwiseNormalPrior"
    assert spec["args"]["gain"] == pytest.approx(REGRESSION_GAIN)
    assert type(resolve_prior(None)) is NormalPrior
