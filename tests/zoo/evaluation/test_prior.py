"""zoo.prior_predictive: what a network believes before data."""

import pytest
import torch
from torch import nn

import zoo
from zoo.models import from_module


@pytest.mark.slow
def test_the_converted_resnet18s_default_prior_is_not_certain_on_noise():
    from torchvision.models import resnet18

    torch.manual_seed(0)
    net = resnet18(num_classes=10)
    noise = torch.randn(8, 3, 64, 64)
    default = zoo.prior_predictive(from_module(net), noise, num_samples=6)
    unit = zoo.prior_predictive(from_module(net, prior=1.0), noise, num_samples=6)
    assert default.sample_probs.max(-1).values.mean() < 0.7
    assert unit.sample_probs.max(-1).values.mean() > 0.85


def test_prior_predictive_of_a_regression_model_and_its_refusals():
    model = zoo.models.BayesianMLP(2, (8,), task="regression")
    x = torch.randn(10, 2)
    before = torch.get_rng_state()
    pred = zoo.prior_predictive(model, x, num_samples=7, statistics="running")
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator untouched
    assert pred.sample_means.shape[:2] == (7, 10)
    again = zoo.prior_predictive(model, x, num_samples=7, statistics="running")
    torch.testing.assert_close(pred.mean, again.mean)  # seeded
    with pytest.raises(ValueError, match="statistics must be 'batch' or 'running'"):
        zoo.prior_predictive(model, x, statistics="eval")
    with pytest.raises(ValueError, match="num_samples"):
        zoo.prior_predictive(model, x, num_samples=0)
    with pytest.raises(TypeError, match="needs a zoo model"):
        zoo.prior_predictive(nn.Linear(2, 1), x)
    with pytest.raises(ValueError, match="shape|cannot take"):
        zoo.prior_predictive(model, torch.randn(10, 5))
