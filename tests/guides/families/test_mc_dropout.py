"""MC dropout as a variational family, against independent computations: a torch mixture for the
density, Monte Carlo for the moments and the KL, a hand-written dropout network for the outputs."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Categorical, Independent, MixtureSameFamily, Normal, kl_divergence

import guides
from guides.families.mc_dropout import MCDropoutSite, MCDropoutWeight
from zoo.models import BayesianMLP, LeNet5


def weight(shape, p=0.3, sigma=0.3, seed=0):
    torch.manual_seed(seed)
    loc = (0.5 + torch.rand(shape, dtype=torch.float64)) * torch.randn(shape).sign().double()
    return MCDropoutWeight(loc, p, sigma)


def reference_log_prob(d, value):
    """Sum over input columns of a torch mixture of two Gaussians over the column."""
    loc = d.loc.movedim(1, 0).reshape(d.columns, -1)  # (in, K)
    means = torch.stack([loc, torch.zeros_like(loc)], 1)  # (in, 2, K)
    comp = Independent(Normal(means, d.sigma), 1)
    mix = MixtureSameFamily(Categorical(torch.tensor([1 - d.p, d.p], dtype=loc.dtype)), comp)
    cols = value.movedim(-len(d.event_shape) + 1, -len(d.event_shape))
    cols = cols.reshape(value.shape[: value.dim() - len(d.event_shape)] + (d.columns, -1))
    return mix.log_prob(cols).sum(-1)


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 2, 2)])
def test_log_prob_is_the_mixture_density(shape):
    d = weight(shape)
    torch.manual_seed(1)
    own = d.rsample((6,))
    other = d.mean + 0.5 * torch.randn((6,) + shape, dtype=torch.float64)
    for value in (own, other):
        assert torch.allclose(d.log_prob(value), reference_log_prob(d, value), atol=1e-9)


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 2, 2)])
def test_moments_match_samples(shape):
    d = weight(shape)
    torch.manual_seed(2)
    n = math.prod(shape)
    draws = d.rsample((60_000,)).reshape(60_000, n)
    cov = d.covariance_matrix
    assert torch.allclose(d.variance.reshape(-1), cov.diagonal())
    assert (draws.mean(0) - d.mean.reshape(-1)).abs().max() < 0.03
    assert (torch.cov(draws.T) - cov).abs().max() < 0.04 * cov.diagonal().max()


def test_whole_columns_are_dropped_at_rate_p():
    d = weight((50, 40), p=0.3, sigma=1e-3)
    torch.manual_seed(3)
    draws = d.rsample((200,))
    kept = (draws - d.loc).abs().amax(1) < 10 * d.sigma  # (200, in)
    dropped = draws.abs().amax(1) < 10 * d.sigma
    assert (kept ^ dropped).all()  # every column is whole: either M_:j or 0
    assert abs(dropped.double().mean().item() - 0.3) < 0.02


def test_kl_is_gals_l2_term_plus_a_constant():
    """KL(q || N(0, s^2)) - KL(q' || N(0, s^2)) = (1 - p) (|M|^2 - |M'|^2) / (2 s^2)."""
    p, s = 0.25, 0.7
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), s).expand((5, 4)).to_event(2)
    a, b = weight((5, 4), p=p, sigma=0.01, seed=4), weight((5, 4), p=p, sigma=0.01, seed=5)
    diff = kl_divergence(a, prior) - kl_divergence(b, prior)
    expected = (1 - p) * (a.loc.pow(2).sum() - b.loc.pow(2).sum()) / (2 * s**2)
    assert torch.allclose(diff, expected)
    # the gradient in M is the L2 term's: (1 - p) M / s^2
    loc = a.loc.clone().requires_grad_()
    kl_divergence(MCDropoutWeight(loc, p, 0.01), prior).backward()
    assert torch.allclose(loc.grad, (1 - p) * loc.detach() / s**2)


def test_kl_matches_monte_carlo_for_well_separated_columns():
    d = weight((4, 3), p=0.3, sigma=0.05, seed=6)
    prior = dist.Normal(torch.tensor(0.1, dtype=torch.float64), 0.8).expand((4, 3)).to_event(2)
    torch.manual_seed(7)
    w = d.rsample((40_000,))
    ratio = d.log_prob(w) - prior.log_prob(w)
    stderr = ratio.std() / math.sqrt(len(ratio))
    assert abs(kl_divergence(d, prior) - ratio.mean()) < 4 * stderr


def test_same_masks_give_the_outputs_of_a_hand_written_dropout_network():
    model = BayesianMLP(6, (8,), 4, task="classification")
    guide = guides.AutoMCDropout(model, p=0.5)
    x, y = torch.randn(10, 6), torch.randint(0, 4, (10,))
    guide(x, y)
    m1, b1, m2, b2 = (
        guide.site_posterior(name).loc.detach()
        for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    )
    torch.manual_seed(8)
    z1, z2 = torch.bernoulli(torch.full((6,), 0.5)), torch.bernoulli(torch.full((8,), 0.5))

    def hand_written(x):  # dropout of each layer's inputs with fixed masks, no rescaling
        return F.linear(torch.relu(F.linear(x * z1, m1, b1)) * z2, m2, b2)

    w1 = guide.get_posterior("fc1.weight").weight(z1)
    w2 = guide.get_posterior("fc2.weight").weight(z2)
    out = model.network(x, {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2})
    assert torch.allclose(out, hand_written(x), atol=1e-6)

    # and the guide's own draws are such networks: recover each draw's masks, compare
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    w1, w2 = trace.nodes["fc1.weight"]["value"], trace.nodes["fc2.weight"]["value"]
    z1 = ((w1 - m1).abs().amax(0) < 0.01).float()
    z2 = ((w2 - m2).abs().amax(0) < 0.01).float()
    b1, b2 = trace.nodes["fc1.bias"]["value"], trace.nodes["fc2.bias"]["value"]
    out = model.network(x, {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2})
    assert torch.allclose(out, hand_written(x), atol=0.02)  # up to the sigma = 1e-3 blur


def test_convolutions_drop_whole_input_channels():
    model = LeNet5()
    guide = guides.AutoMCDropout(model, p=0.5)
    x, y = torch.randn(2, 1, 28, 28), torch.tensor([3, 7])
    guide(x, y)
    m = guide.site_posterior("conv2.weight").loc.detach()  # (50, 20, 5, 5)
    w = pyro.poutine.trace(guide).get_trace(x, y).nodes["conv2.weight"]["value"]
    kept = (w - m).abs().amax((0, 2, 3)) < 0.01
    dropped = w.abs().amax((0, 2, 3)) < 0.01
    assert (kept ^ dropped).all() and dropped.any() and kept.any()
    # the draw is M with those input channels zeroed (up to the sigma = 1e-3 blur), so the layer
    # computes dropout of its input channels
    z = kept.float()[None, :, None, None]
    assert (w - m * z).abs().max() < 6e-3
    h = torch.randn(3, 20, 12, 12)
    assert torch.allclose(F.conv2d(h * z, m), F.conv2d(h, m * z), atol=1e-5)


def test_local_estimator_draws_a_mask_per_example():
    """Per-example outputs have the exact mean and variance under q."""
    d = weight((3, 5), p=0.4, sigma=0.05, seed=9)
    bias = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    x = torch.randn(1, 5, dtype=torch.float64).expand(40_000, 5)
    torch.manual_seed(10)
    out = d.local_linear(x, bias)
    mean = (1 - d.p) * x[0] @ d.loc.T + bias
    var = (d.variance * x[0].pow(2)).sum(-1)
    assert (out.mean(0) - mean).abs().max() < 4 * (var / 40_000).sqrt().max()
    assert torch.allclose(out.var(0), var, rtol=0.05)


def test_quantiles_are_the_mixture_marginal_quantiles():
    d = weight((4, 3), p=0.3, sigma=0.2)
    q = torch.tensor([0.05, 0.3, 0.5, 0.95], dtype=torch.float64).reshape(4, 1, 1)
    values = d.marginal_icdf(q)
    unit = Normal(0.0, 1.0)
    cdf = (1 - d.p) * unit.cdf((values - d.loc) / d.sigma) + d.p * unit.cdf(values / d.sigma)
    assert torch.allclose(cdf, q.expand_as(cdf), atol=1e-9)


def test_biases_are_narrow_gaussians_with_the_fixed_sigma():
    site = MCDropoutSite(torch.randn(7), 0.5, p=0.2, sigma=0.01)
    d = site.distribution()
    assert torch.allclose(d.variance, torch.full((7,), 1e-4))
    assert [n for n, _ in site.named_parameters()] == ["loc_unconstrained"]  # M only


@pytest.mark.parametrize("p, sigma", [(1.0, 0.01), (-0.1, 0.01), (0.1, 0.0), (True, 0.01)])
def test_bad_dropout_options_are_refused(p, sigma):
    with pytest.raises(ValueError, match="p must lie in|sigma must be"):
        guides.AutoMCDropout(BayesianMLP(3, (4,), 1), p=p, sigma=sigma)


def test_the_kl_to_zoos_default_prior_is_the_same_closed_form():
    from zoo.priors import NormalPrior

    d = weight((5, 4), p=0.2, sigma=0.01, seed=11)
    elementwise = torch.full((5, 4), 0.7, dtype=torch.float64)  # the general path
    general = dist.Normal(torch.zeros_like(elementwise), elementwise).to_event(2)
    scalar = dist.Normal(torch.tensor(0.0, dtype=torch.float64), 0.7).expand((5, 4)).to_event(2)
    assert torch.allclose(kl_divergence(d, general), kl_divergence(d, scalar))
    zoo_prior = NormalPrior(0.7).distribution(torch.Size((5, 4)), fan_in=4)
    torch_prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), 0.7).expand((5, 4))
    expected = kl_divergence(d, torch_prior.to_event(2))
    assert torch.allclose(kl_divergence(d, zoo_prior).double(), expected)


def test_local_estimator_masks_input_channels_per_example_in_a_convolution():
    """conv2d under estimator='local': the masks are drawn per example and channel, so the
    outputs' spread across examples has the mean and variance that the masks give under q (the
    sigma blur, one draw for the batch, is made negligible here)."""
    d = weight((2, 3, 2, 2), p=0.3, sigma=1e-6, seed=12)
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64).expand(20_000, 3, 4, 4)
    bias = torch.tensor([0.2, -0.1], dtype=torch.float64)
    args = {"input": x, "weight": None, "bias": bias, "stride": 1, "padding": 0}
    torch.manual_seed(13)
    out = d.local_conv(F.conv2d, args)
    per_channel = torch.stack([F.conv2d(x[:1, c : c + 1], d.loc[:, c : c + 1]) for c in range(3)])
    mean = (1 - d.p) * per_channel.sum(0)[0] + bias[:, None, None]
    var = d.p * (1 - d.p) * per_channel.pow(2).sum(0)[0]
    assert (out.mean(0) - mean).abs().max() < 4 * (var / 20_000).sqrt().max()
    assert torch.allclose(out.var(0), var, rtol=0.06)


def test_a_fit_with_the_local_estimator_serves_every_weight_of_a_convnet():
    import zoo

    model = LeNet5()
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    fit = zoo.fit(
        model,
        "mc_dropout",
        (x, y),
        num_steps=2,
        loss=zoo.Loss(estimator="local"),
        run=zoo.Run(progress=False),
    )
    assert fit.steps == 2
    objective = zoo.Objective(model, fit.guide, estimator="local")
    objective.setup(x, y)
    assert objective.served == {"conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"}


def _weight_p(guide, model, x, y) -> dict[str, float]:
    from guides.site import direct_parameters

    with direct_parameters():  # zoo's route: guides of other models do not meet in Pyro's store
        guide(x, y)
    return {n: guide.site_posterior(n).p for n in guide.site_names if n.endswith("weight")}


def test_the_image_is_not_dropped_but_input_features_are():
    """The first layer's dropout: none over a convolution's input channels (a one-channel image
    would be dropped whole), ``p`` over input features, ``input_p`` when given."""
    lenet, images, labels = LeNet5(), torch.randn(2, 1, 28, 28), torch.tensor([1, 2])
    p = _weight_p(guides.AutoMCDropout(lenet, p=0.2), lenet, images, labels)
    assert p == {"conv1.weight": 0.0, "conv2.weight": 0.2, "fc1.weight": 0.2, "fc2.weight": 0.2}
    given = _weight_p(guides.AutoMCDropout(lenet, input_p=0.1), lenet, images, labels)
    assert given["conv1.weight"] == 0.1 and given["fc2.weight"] == 0.1
    mlp, x, y = BayesianMLP(3, (4,), 1, task="regression"), torch.randn(2, 3), torch.randn(2)
    p = _weight_p(guides.AutoMCDropout(mlp, p=0.2), mlp, x, y)
    assert list(p.values()) == [0.2, 0.2]
    assert list(_weight_p(guides.AutoMCDropout(mlp, input_p=0.0), mlp, x, y).values()) == [0, 0.1]
    # No draw of the first convolution has a dropped (all but sigma-blur) input channel.
    guide = guides.AutoMCDropout(lenet)
    _weight_p(guide, lenet, images, labels)
    draws = guide.site_posterior("conv1.weight").distribution().rsample((200,))
    assert draws.abs().amax(dim=(1, 3, 4)).min() > 10 * 1e-3


def test_input_p_is_checked_and_saved(tmp_path):
    import zoo

    with pytest.raises(ValueError, match="input_p must lie in"):
        guides.AutoMCDropout(LeNet5(), input_p=1.0)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    fit = zoo.fit(
        LeNet5(),
        guides.family("mc_dropout", input_p=0.05),
        (x, y),
        num_steps=1,
        run=zoo.Run(progress=False),
    )
    fit.save(tmp_path / "fit.zoo")
    loaded = zoo.load(tmp_path / "fit.zoo")
    assert loaded.guide.input_p == 0.05
    assert loaded.guide.site_posterior("conv1.weight").p == 0.05
