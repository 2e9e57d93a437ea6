"""A trained network made Bayesian keeps what it knew: its weights as every family's start, a
frozen body's statistics, padding rows, no stochastic layer, a prior whose predictive is not
certain on noise, and an output contract checked on the first call."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import guides
import zoo
from tests.families import PRIMARY
from zoo.models import from_module

QUIET = zoo.Run(progress=False)


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 3),
    )


def _blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes of 8x8 images, each a bright quadrant plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, 8, 8, generator=g)
    for c, (r, s) in enumerate([(0, 0), (0, 4), (4, 0)]):
        x[y == c, :, r : r + 4, s : s + 4] += 1.0
    return x, y


@pytest.fixture(scope="module")
def trained():
    """A small CNN with batch norm trained in a plain PyTorch loop, and its data."""
    x, y = _blobs(600, 0)
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = _cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(6):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval(), (x, y), _blobs(400, 1)


def _metrics(probs, y):
    return zoo.metrics.accuracy(probs, y), zoo.metrics.nll(probs, y)


@pytest.mark.parametrize("family", sorted(set(PRIMARY) - {"whvi"}))
def test_every_family_starts_at_the_trained_weights(trained, family):
    net, (x, y), _ = trained
    model = from_module(net)
    guide = guides.get(family)(model)
    with zoo.models.frozen_statistics():
        guide(x[:4], y[:4])
    means = model.net_means()
    median = guide.median()
    if family == "mc_dropout":  # the mean network is the trained one: M (1 - p) = W
        sites = {n: guide.site_posterior(n) for n in median}
        median = {n: s.loc * (1 - s.p) if s.loc.dim() > 1 else s.loc for n, s in sites.items()}
    for name in model.site_shapes:
        torch.testing.assert_close(median[name], means[name], msg=f"{family}: {name}")


def test_whvi_starts_from_its_own_draw_and_fresh_starts_anew(trained):
    net, (x, y), _ = trained
    whvi = guides.get("whvi")(from_module(net))
    fresh = guides.get("diagonal")(from_module(net, init="fresh"))
    kaiming = guides.get("diagonal")(from_module(net), init_loc_fn="kaiming")
    for guide in (whvi, fresh, kaiming):
        with zoo.models.frozen_statistics():
            guide(x[:4], y[:4])
        assert not torch.allclose(guide.median()["5.weight"], net[5].weight, atol=1e-3)


def test_a_short_default_fit_keeps_the_trained_accuracy_and_nll(trained):
    net, data, (xt, yt) = trained
    with torch.no_grad():
        acc0, nll0 = _metrics(net(xt).softmax(-1), yt)
    assert acc0 > 0.9  # the network learned the task
    fit = zoo.fit(from_module(net), "diagonal", data, num_steps=30, run=QUIET)
    pred = fit.predict(xt, num_samples=20, progress=False)
    acc, nll = _metrics(pred.probs, yt)
    assert acc >= acc0 - 0.02 and nll <= nll0 + 0.05, (acc0, nll0, acc, nll)
    fresh = zoo.fit(from_module(net, init="fresh"), "diagonal", data, num_steps=30, run=QUIET)
    _, nll_fresh = _metrics(fresh.predict(xt, num_samples=20, progress=False).probs, yt)
    assert nll_fresh > nll + 0.05  # a fresh start (the old default) has not caught up


def test_a_frozen_body_keeps_its_running_statistics(trained):
    net, data, _ = trained
    frozen = from_module(net.requires_grad_(False), bayesian=["5.*"])
    net.requires_grad_(True)
    before = {n: b.clone() for n, b in frozen.net.named_buffers()}
    zoo.fit(frozen, "lowrank", data, num_steps=10, lr=0.05, run=QUIET)
    for name, value in frozen.net.named_buffers():
        assert torch.equal(value, before[name]), name
    assert not frozen.net[1].training  # evaluation mode, whatever the model's
    trainable = from_module(net, bayesian=["5.*"])
    zoo.fit(trainable, "lowrank", data, num_steps=10, lr=0.05, run=QUIET)
    assert not torch.equal(trainable.net[1].running_mean, before["1.running_mean"])


class Bag(nn.Module):
    def __init__(self, padding_idx=0):
        super().__init__()
        self.emb = nn.Embedding(12, 4, padding_idx=padding_idx)
        self.fc = nn.Linear(4, 3)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).sum(1))


def test_padding_rows_stay_zero_and_padding_changes_no_prediction():
    torch.manual_seed(0)
    net = Bag(padding_idx=-1)  # row 11
    model = from_module(net)
    assert model.site_shapes["emb.weight"] == (11, 4)
    tokens = torch.randint(0, 11, (40, 5))
    y = torch.randint(0, 3, (40,))
    fit = zoo.fit(model, "diagonal", (tokens, y), num_steps=5, lr=0.05, run=QUIET)
    padded = torch.cat([tokens, torch.full((40, 3), 11)], dim=1)
    short = fit.predict(tokens, num_samples=10, progress=False).probs
    long = fit.predict(padded, num_samples=10, progress=False).probs
    torch.testing.assert_close(short, long)
    with torch.no_grad():
        torch.testing.assert_close(net(tokens), net(padded))  # PyTorch's meaning
    guide = guides.AutoDiagonal(from_module(net), init_module=net)  # a (12, 4) weight given
    with zoo.models.frozen_statistics():
        guide(tokens[:2], y[:2])
    torch.testing.assert_close(guide.median()["emb.weight"], net.emb.weight[:11])


def test_stochastic_layers_are_removed_by_one_rule():
    from torchvision.ops import StochasticDepth

    net = nn.Sequential(nn.Linear(4, 4), StochasticDepth(0.5, "row"), nn.Dropout(0.3))
    net.append(nn.Linear(4, 2))
    model = from_module(net)
    assert isinstance(model.net[1], nn.Identity) and isinstance(model.net[2], nn.Identity)
    assert isinstance(net[1], StochasticDepth)  # the user's module is unchanged
    x = torch.randn(8, 4)
    params = model.net_means()
    with torch.no_grad():  # training mode: a random layer left would differ between calls
        torch.testing.assert_close(model.network(x, params), model.network(x, params))


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


class Broadcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).unsqueeze(1)  # (B, 1, C)


class Bare(nn.Module):
    """Bare parameters used in forward, the output layer registered before the hidden one."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 10)
        self.hidden = nn.Linear(4, 16)
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)) * self.scale)


def test_outputs_outside_the_contract_are_refused_or_selected():
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.raises(ValueError, match=r"classification takes logits of shape \(batch"):
        zoo.fit(from_module(Broadcast()), "diagonal", (x, y), num_steps=1, run=QUIET)
    lstm = nn.LSTM(4, 3, batch_first=True)
    seq = torch.randn(20, 5, 4)
    with pytest.raises(TypeError, match="returns a tuple of 2.*output=0"):
        zoo.fit(from_module(lstm), "diagonal", (seq, y), num_steps=1, run=QUIET)
    selected = from_module(lstm, output=lambda out: out[0][:, -1])
    fit = zoo.fit(selected, "diagonal", (seq, y), num_steps=2, run=QUIET)
    assert fit.predict(seq, num_samples=3, progress=False).probs.shape == (20, 3)
    with pytest.raises(TypeError, match="output must be an index"):
        from_module(lstm, output=1.5)


def test_bare_parameters_are_sites_and_the_class_count_is_the_outputs():
    model = from_module(Bare())
    assert "scale" in model.site_shapes
    x, y = torch.randn(30, 4), torch.randint(0, 10, (30,))
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=2, run=QUIET)
    assert model.out_features == 10  # read from the output, not from the last layer (16)
    assert fit.predict(x, num_samples=2, progress=False).probs.shape == (30, 10)
    with pytest.raises(ValueError, match="label"):
        zoo.fit(from_module(Bare()), "diagonal", (x, y + 5), num_steps=1, run=QUIET)


def test_regression_outputs_of_shape_batch_are_one_output_per_example():
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1), nn.Flatten(0))
    x = torch.randn(40, 3)
    y = x.sum(1)
    fit = zoo.fit(from_module(net, task="regression"), "diagonal", (x, y), num_steps=3, run=QUIET)
    assert fit.predict(x, num_samples=2, progress=False).mean.shape == (40,)


@pytest.mark.parametrize("shape", [(-3,), (0, 4), "28", (2.5,)])
def test_a_bad_input_shape_is_refused(shape):
    with pytest.raises(ValueError, match="input_shape must be a tuple of sizes"):
        from_module(nn.Linear(3, 2), input_shape=shape)


def test_init_must_be_module_or_fresh():
    with pytest.raises(ValueError, match="init must be 'module'"):
        from_module(nn.Linear(3, 2), init="trained")
    with pytest.raises(ValueError, match="init_loc_fn must be 'auto', 'kaiming'"):
        guides.AutoDiagonal(from_module(nn.Linear(3, 2)), init_loc_fn="module")


def test_ensemble_members_start_from_their_own_draws(trained):
    net, (x, y), _ = trained
    ens = zoo.ensemble(lambda: from_module(net), (x[:64], y[:64]), members=2, num_steps=1,
                       progress=False)  # fmt: skip
    first, second = (m.guide.median()["5.weight"] for m in ens.members)
    assert not torch.allclose(first, second, atol=1e-2)
    assert not torch.allclose(first, net[5].weight, atol=1e-2)


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


def test_a_centred_prior_is_moped_around_the_trained_weights(trained):
    from torch.distributions import kl_divergence

    from zoo.priors import CentredNormalPrior

    net, (x, y), _ = trained
    model = from_module(net, prior=CentredNormalPrior(net, delta=0.1))
    params = model.net_means()
    site = model.prior.site_distribution("5.weight", model.site_shapes["5.weight"], 128, {})
    torch.testing.assert_close(site.mean, params["5.weight"])
    expected = (0.1 * params["5.weight"].abs()).clamp_min(1e-4)
    torch.testing.assert_close(site.stddev, expected)
    guide = guides.AutoDiagonal(model)
    with zoo.models.frozen_statistics():
        guide(x[:4], y[:4])
    q = guide.get_posterior("5.weight")
    dense_q = torch.distributions.Normal(q.mean, q.variance.sqrt())
    dense_p = torch.distributions.Normal(site.mean, site.stddev)
    torch.testing.assert_close(kl_divergence(q, site), kl_divergence(dense_q, dense_p).sum())
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=3, loss=zoo.Loss(elbo="meanfield"),
                  run=QUIET)  # fmt: skip
    assert fit.losses[-1] == fit.losses[-1]  # finite, closed-form KL
    with pytest.raises(ValueError, match="needs a centre of each site's shape"):
        from_module(Bare(), prior=CentredNormalPrior({"out.weight": torch.zeros(10, 16)}))
    with pytest.raises(ValueError, match="scale must be a positive number"):
        CentredNormalPrior(net, scale=0)
    with pytest.raises(TypeError, match="weights must be an nn.Module or a mapping"):
        CentredNormalPrior([1, 2])
