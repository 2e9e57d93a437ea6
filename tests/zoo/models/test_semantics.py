"""What a converted network means, kept (zoo.models.semantics): a frozen body's batch-norm
statistics, padding rows, each layer kind's prior fan-in, and the output contract checked on
the first call."""

import warnings

import pyro
import pytest
import torch
from torch import nn

import guides
import zoo
from tests.trained import trained_cnn
from zoo.models import from_module
from zoo.models.base import swapped_parameters

QUIET = zoo.Run(progress=False)


@pytest.fixture
def trained():
    return trained_cnn()


def test_a_frozen_body_keeps_its_running_statistics(trained):
    net, data, _ = trained
    frozen = from_module(net.requires_grad_(False), bayesian=["5.*"], init="module")
    net.requires_grad_(True)
    before = {n: b.clone() for n, b in frozen.net.named_buffers()}
    zoo.fit(frozen, "lowrank", data, num_steps=10, lr=0.05, run=QUIET)
    for name, value in frozen.net.named_buffers():
        assert torch.equal(value, before[name]), name
    assert not frozen.net[1].training  # evaluation mode, whatever the model's
    trainable = from_module(net, bayesian=["5.*"], init="module")
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
    model = from_module(net, init="module")
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
    guide = guides.AutoDiagonal(
        from_module(net, init="module"), init_module=net
    )  # a (12, 4) weight given
    with zoo.models.frozen_statistics():
        guide(tokens[:2], y[:2])
    torch.testing.assert_close(guide.median()["emb.weight"], net.emb.weight[:11])


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
        zoo.fit(from_module(Broadcast(), init="module"), "diagonal", (x, y), num_steps=1, run=QUIET)
    lstm = nn.LSTM(4, 3, batch_first=True)
    seq = torch.randn(20, 5, 4)
    with pytest.raises(TypeError, match="returns a tuple of 2.*output=0"):
        zoo.fit(from_module(lstm, init="module"), "diagonal", (seq, y), num_steps=1, run=QUIET)
    selected = from_module(lstm, output=lambda out: out[0][:, -1], init="module")
    fit = zoo.fit(selected, "diagonal", (seq, y), num_steps=2, run=QUIET)
    assert fit.predict(seq, num_samples=3, progress=False).probs.shape == (20, 3)
    with pytest.raises(TypeError, match="output must be an index"):
        from_module(lstm, output=1.5, init="module")


def test_bare_parameters_are_sites_and_the_class_count_is_the_outputs():
    model = from_module(Bare(), init="module")
    assert "scale" in model.site_shapes
    x, y = torch.randn(30, 4), torch.randint(0, 10, (30,))
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=2, run=QUIET)
    assert model.out_features == 10  # read from the output, not from the last layer (16)
    assert fit.predict(x, num_samples=2, progress=False).probs.shape == (30, 10)
    with pytest.raises(ValueError, match="label"):
        zoo.fit(from_module(Bare(), init="module"), "diagonal", (x, y + 5), num_steps=1, run=QUIET)


def test_regression_outputs_of_shape_batch_are_one_output_per_example():
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1), nn.Flatten(0))
    x = torch.randn(40, 3)
    y = x.sum(1)
    fit = zoo.fit(
        from_module(net, task="regression", init="module"),
        "diagonal",
        (x, y),
        num_steps=3,
        run=QUIET,
    )
    assert fit.predict(x, num_samples=2, progress=False).mean.shape == (40,)


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight (a language model's tying)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens):
        return self.out(self.emb(tokens).mean(1))


def test_tied_weights_are_one_site_and_the_compiled_loss_uses_the_draw_everywhere():
    torch.manual_seed(0)
    model = from_module(Tied(), init="module")
    assert list(model.site_shapes) == ["emb.weight"]
    tokens, y = torch.randint(0, 20, (64, 5)), torch.randint(0, 20, (64,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the compiled and eager losses agree: no warning
        fit = zoo.fit(model, "diagonal", (tokens, y), num_steps=3, run=QUIET)
    assert fit.options["jit"] == "compiled"
    draw = {"emb.weight": torch.randn(20, 8)}
    with torch.no_grad(), zoo.models.frozen_statistics():
        eager = model.network(tokens, draw)
        with swapped_parameters(model.net, draw):
            swapped = model.net(tokens)
    torch.testing.assert_close(swapped, eager)


class Kinds(nn.Module):
    """One layer of each kind the prior's fan-in rule names (docs/concepts.md)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16, padding_idx=0)
        self.conv = nn.Conv1d(16, 12, 3, groups=4)
        self.lstm = nn.LSTM(12, 8, batch_first=True)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, tokens):
        h = self.conv(self.emb(tokens).transpose(1, 2)).transpose(1, 2)
        h = self.lstm(h)[0]
        return self.fc(self.att(h, h, h)[0].mean(1))


def test_each_layer_kinds_prior_reads_the_inputs_that_feed_one_output():
    """The default prior's standard deviation of every site is ``sqrt(2 / fan_in)`` with the
    fan-in counted by hand per layer kind: an embedding's lookup reads one row, a grouped
    convolution ``in_channels / groups * kernel``, an LSTM's biases their weights', attention's
    the embedding width. A trained embedding at PyTorch's ``N(0, 1)`` is then under a prior
    standard deviation from zero (it was ``sqrt(d / 2)`` with the width as its fan-in)."""
    torch.manual_seed(0)
    model = from_module(Kinds(), task="classification", init="module")
    by_hand = {
        "emb.weight": 1, "conv.weight": 4 * 3, "conv.bias": 4 * 3,
        "lstm.weight_ih_l0": 12, "lstm.weight_hh_l0": 8, "lstm.bias_ih_l0": 12,
        "lstm.bias_hh_l0": 8, "att.in_proj_weight": 8, "att.in_proj_bias": 8,
        "att.out_proj.weight": 8, "att.out_proj.bias": 8, "fc.weight": 8, "fc.bias": 8,
    }  # fmt: skip
    sites = prior_sites(model, torch.randint(1, 50, (2, 6)))
    assert set(sites) == set(by_hand)
    for name, fn in sites.items():
        scale = torch.as_tensor(fn.scale)
        torch.testing.assert_close(scale, torch.full_like(scale, (2 / by_hand[name]) ** 0.5))
    assert sites["emb.weight"].event_shape == (49, 16)  # the padding row is no site
    rows = model.net.emb.weight[1:]  # N(0, 1) from PyTorch
    assert float(rows.pow(2).mean().sqrt()) < 2**0.5  # within one prior sd, as a ratio
    tied = from_module(Tied(), init="module")  # the output layer reads the same tensor
    scale = torch.as_tensor(prior_sites(tied, torch.randint(0, 20, (2, 5)))["emb.weight"].scale)
    torch.testing.assert_close(scale, torch.full_like(scale, (2 / 8) ** 0.5))


def prior_sites(model, x) -> dict:
    """``{site: prior}`` as the model's trace holds them."""
    trace = pyro.poutine.trace(model).get_trace(x)
    return {n: s["fn"] for n, s in trace.nodes.items() if n in model.site_shapes}
