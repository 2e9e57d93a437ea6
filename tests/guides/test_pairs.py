"""The (mean, scale) pairs each family states for an optimiser (:mod:`guides.pairs`), for every
registered case: the mean is the guide's own leaf and the site's posterior mean, a scale is the
marginal standard deviation, and its gradient is the loss's with respect to that deviation."""

import pytest
import torch

import guides
from guides.pairs import MeanScale
from guides.site import direct_parameters
from tests.families import CASES
from tests.zoo.linear_gaussian import correlated_data, model_for

#: Families that state no pair for a weight matrix: WHVI's mean is a product of factors, MC
#: dropout's a (1 - p) multiple of its parameter.
NO_WEIGHT_PAIR = {"whvi", "mc_dropout"}


def _fitted_guide(label):
    name, options = CASES[label]
    options = dict(options)
    if name == "subnetwork":
        options.setdefault("size", 2)
    torch.manual_seed(0)
    model = model_for(3)
    guide = guides.get(name)(model, **options)
    x, y = correlated_data(n=16, d=3)
    with direct_parameters():  # Pyro's global store untouched
        guide(x, y)
    with torch.no_grad():  # away from the initial values
        for p in guide.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return guide


@pytest.mark.parametrize("label", list(CASES))
def test_every_family_states_its_means_and_only_true_scales(label):
    guide = _fitted_guide(label)
    pairs = guides.mean_scale_pairs(guide)
    leaves = {id(p) for p in guide.parameters()}
    sites = [p.site for p in pairs]
    assert len(set(sites)) == len(sites)
    for pair in pairs:
        assert id(pair.mean) in leaves and pair.mean.requires_grad
        q = guide.get_posterior(pair.site)
        assert pair.mean.shape == q.event_shape
        if pair.site.endswith("weight") and label.split("_")[0] in NO_WEIGHT_PAIR:
            pytest.fail(f"{label} states a pair for {pair.site}")
        assert torch.allclose(pair.mean.detach(), q.mean.detach())
        if pair.raw_scale is not None:
            assert id(pair.raw_scale) in leaves
            assert torch.allclose(pair.std(), q.variance.detach().sqrt())
    name = CASES[label][0]
    weight_pair = "fc1.weight" in sites
    assert weight_pair == (name not in NO_WEIGHT_PAIR)
    scaled = {p.site for p in pairs if p.raw_scale is not None}
    assert (name == "diagonal") == ("fc1.weight" in scaled)


def test_a_scale_gradient_is_the_gradient_with_respect_to_the_deviation():
    guide = _fitted_guide("diagonal")
    pair = {p.site: p for p in guides.mean_scale_pairs(guide)}["fc1.weight"]
    std = pair.std().clone().requires_grad_(True)
    target = torch.randn_like(std)
    (std * target).sum().backward()  # d/dstd = target, the reference
    rho = pair.raw_scale
    (torch.nn.functional.softplus(rho) * target).sum().backward()
    assert torch.allclose(pair.std_grad(), std.grad)


def test_set_std_writes_the_deviation_and_refuses_what_it_cannot_hold():
    guide = _fitted_guide("diagonal")
    pair = {p.site: p for p in guides.mean_scale_pairs(guide)}["fc1.weight"]
    want = torch.full_like(pair.mean, 0.25)
    pair.set_std(want)
    assert torch.allclose(pair.std(), want)
    assert torch.allclose(guide.get_posterior("fc1.weight").stddev, want)
    with pytest.raises(ValueError, match="positive values shaped"):
        pair.set_std(torch.zeros_like(want))
    with pytest.raises(ValueError, match="positive values shaped"):
        pair.set_std(torch.ones(7))
    mean_only = MeanScale("w", torch.zeros(2))
    with pytest.raises(ValueError, match="states a mean and no scale"):
        mean_only.std()
    assert MeanScale("w", torch.zeros(2), torch.zeros(2)).std_grad() is None


def test_a_guide_that_is_no_family_or_not_yet_run_states_none():
    from pyro.infer.autoguide import AutoNormal

    model = model_for(3)
    assert guides.mean_scale_pairs(AutoNormal(model)) == []
    assert guides.mean_scale_pairs(guides.AutoDiagonal(model)) == []
