"""A converted network's start: given, or inferred from its loss on the data (init="auto")."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from tests.trained import blobs, cnn
from zoo.training.start import PROBE_EXAMPLES, StartWarning


class Tokens(nn.Module):
    """A classifier of token sequences: an embedding, then a transformer or an LSTM."""

    def __init__(self, kind: str):
        super().__init__()
        self.embed = nn.Embedding(12, 16)
        if kind == "transformer":
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        else:
            self.body = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.body(self.embed(x))
        h = h[0] if isinstance(h, tuple) else h
        return self.head(h.mean(1))


def _tokens(n: int, seed: int):
    """Three classes of sequences of 6 tokens: class c draws from tokens 4c .. 4c + 3."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return 4 * y[:, None] + torch.randint(0, 4, (n, 6), generator=g), y


NETWORKS = {
    "cnn": (cnn, blobs),
    "mlp": (
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3)),
        blobs,
    ),
    "transformer": (lambda: Tokens("transformer"), _tokens),
    "lstm": (lambda: Tokens("lstm"), _tokens),
}


def _built(kind: str):
    make, data = NETWORKS[kind]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = make()
    return net, data(400, 0)


def _trained(kind: str):
    net, (x, y) = _built(kind)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(8):
        for idx in torch.randperm(len(x), generator=gen).split(50):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval(), (x, y)


def _fit(model, data):
    return zoo.fit(model, "diagonal", data, epochs=1, batch_size=50, run={"progress": False})


@pytest.mark.parametrize("kind", sorted(NETWORKS))
def test_a_network_just_built_fits_as_init_fresh_does_and_says_so(kind):
    net, data = _built(kind)
    with pytest.warns(StartWarning, match="for a fresh one .*init='fresh'"):
        inferred = _fit(zoo.models.from_module(net), data)
    given = _fit(zoo.models.from_module(net, init="fresh"), data)
    assert inferred.options["start"] == given.options["start"] == "fresh"
    assert inferred.options["start_rule"].startswith("inferred: its loss")
    assert given.options["start_rule"] == "given (init='fresh')"
    assert inferred.losses == given.losses  # the same fit, step for step
    assert inferred.options["lr"] == given.options["lr"]
    assert "fresh start" in repr(inferred)


@pytest.mark.parametrize("kind", sorted(NETWORKS))
def test_a_trained_network_fits_as_init_module_does_and_says_so(kind):
    net, data = _trained(kind)
    with pytest.warns(StartWarning, match="for a trained one .*init='module'"):
        inferred = _fit(zoo.models.from_module(net), data)
    given = _fit(zoo.models.from_module(net, init="module"), data)
    assert inferred.options["start"] == given.options["start"] == "trained"
    assert inferred.options["lr_rule"] == "default (trained start)"
    assert inferred.losses == given.losses
    assert "trained start" in repr(inferred)


def test_a_given_start_does_not_warn_and_the_look_moves_no_generator():
    net, data = _built("cnn")
    before = torch.random.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = _fit(zoo.models.from_module(net, init="fresh"), data)
    assert fit.options["start"] == "fresh"
    from zoo.training.start import resolve_start

    model = zoo.models.from_module(net)
    start = resolve_start(model, data)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert start.init == model.inferred_init == "fresh"
    assert f"on {PROBE_EXAMPLES} training examples" in start.rule
    assert model.training  # the look's evaluation mode is put back


def test_a_family_that_draws_its_own_start_says_so_on_a_trained_network():
    net, data = _trained("mlp")
    fit = zoo.fit(
        zoo.models.from_module(net, init="module"), "whvi", data, epochs=1, batch_size=50,
        run={"progress": False},
    )  # fmt: skip
    assert fit.options["start"] == "fresh"
    assert fit.options["start_rule"].startswith("the family draws its own start")


def test_regression_is_judged_on_the_targets_variance():
    """A network is trained when it explains half the targets' variance: random linear layers
    on linear targets (which explain part of it by chance) all start fresh, the true weights
    start trained."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    net = nn.Linear(4, 1)
    model = zoo.models.from_module(net, task="regression")
    from zoo.training.start import resolve_start

    assert resolve_start(model, (x, y[:, None].squeeze(-1))).init == "fresh"
    chance = []
    for seed in range(40):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            layer = nn.Linear(4, 1)
        network, variance = zoo.models.from_module(
            layer, task="regression"
        ).likelihood.point_losses(layer(x).detach().squeeze(-1), y)
        chance.append(network / variance)
        start = resolve_start(zoo.models.from_module(layer, task="regression"), (x, y))
        assert start.init == "fresh", start.rule
    assert min(chance) < 0.9  # the classifiers' threshold would have taken some for trained
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
        net.bias.zero_()
    model = zoo.models.from_module(net, task="regression")
    assert resolve_start(model, (x, y)).init == "module"


def test_bad_data_get_their_own_error_and_no_start_warning():
    net, _ = _built("cnn")
    x, y = blobs(100, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StartWarning)
        with pytest.raises(ValueError, match="labels must lie in"):
            _fit(zoo.models.from_module(net), (x, y + 5))  # labels past the network's 3
        with pytest.raises(ValueError, match="different lengths"):
            _fit(zoo.models.from_module(net), (x, y[:50]))


def test_init_is_checked_when_the_model_is_built():
    net, _ = _built("cnn")
    with pytest.raises(ValueError, match="init must be 'module', 'fresh' or 'auto'"):
        zoo.models.from_module(net, init="trained")
