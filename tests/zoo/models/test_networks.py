"""The zoo's networks for the architectures of the field: ResNet, AlexNet, transformer, LSTM."""

import pytest
import torch
from torch import nn

import guides
import zoo
from zoo.inference.compiled import compile_refusal
from zoo.models import AlexNet, RecurrentClassifier, ResNet, TransformerClassifier, build
from zoo.models.transformer import SelfAttention

NETWORKS = {
    "resnet20": (lambda: ResNet(in_channels=1, input_size=28, width=4), (1, 28, 28)),
    "resnet_padded": (lambda: ResNet(depth=8, in_channels=1, width=4), (1, 32, 32)),
    "alexnet": (lambda: AlexNet(1, widths=(4, 6, 8, 8, 8), hidden=16, size=28), (1, 28, 28)),
    "transformer": (
        lambda: TransformerClassifier(in_features=28, d_model=16, seq_len=28),
        (28, 28),
    ),
    "transformer_tokens": (lambda: TransformerClassifier(vocab_size=30, d_model=16), (9,)),
    "lstm": (lambda: RecurrentClassifier(28, hidden=8, seq_len=28), (28, 28)),
    "gru": (lambda: RecurrentClassifier(5, hidden=6, cell="gru", layers=2), (7, 5)),
}


def inputs(name, shape, n):
    if name == "transformer_tokens":
        return torch.randint(0, 30, (n, *shape))
    return torch.randn(n, *shape)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_draws_run_vectorised_as_a_loop_over_them_does_and_the_spec_rebuilds(name):
    make, shape = NETWORKS[name]
    model = make()
    model.eval()
    x = inputs(name, shape, 4)
    gen = torch.Generator().manual_seed(0)
    draws = {n: torch.randn((3, *s), generator=gen) * 0.1 for n, s in model.site_shapes.items()}
    batched = model.network(x, draws)
    looped = torch.stack([model.network(x, {k: v[s] for k, v in draws.items()}) for s in range(3)])
    assert batched.shape == (3, 4, 10)
    assert torch.allclose(batched, looped, atol=1e-5)
    again = build(model.spec())
    assert type(again) is type(model) and again.spec() == model.spec()
    assert {n: tuple(s) for n, s in again.site_shapes.items()} == {
        n: tuple(s) for n, s in model.site_shapes.items()
    }


def test_resnet20_is_he_et_als():
    model = ResNet()
    convs = [n for n in model.site_shapes if n.endswith("weight") and "conv" in n]
    assert len(convs) + 1 == 20  # 19 convolutions and the linear layer
    assert tuple(model.site_shapes["fc.weight"]) == (10, 64)
    assert all("bn" not in n for n in model.site_shapes)  # batch norm is deterministic
    assert len(model.deterministic) == 2 * 19 and len(model._statistics) == 3 * 19
    assert 0.26e6 < sum(p.numel() for p in model.net.parameters()) < 0.28e6
    with pytest.raises(ValueError, match="6 n \\+ 2"):
        ResNet(depth=21)


def test_attention_is_pytorchs_multihead_attention():
    torch.manual_seed(0)
    ours, theirs = SelfAttention(12, 3), nn.MultiheadAttention(12, 3, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 12)
    assert torch.allclose(ours(x), theirs(x, x, x, need_weights=False)[0], atol=1e-6)


@pytest.mark.parametrize("cell, torch_cls", [("lstm", nn.LSTM), ("gru", nn.GRU)])
@pytest.mark.parametrize("layers", [1, 2])
def test_recurrent_classifier_runs_pytorchs_fused_layer_under_each_draw(cell, torch_cls, layers):
    """The network is PyTorch's own layer (its fused kernel), its sites keep the names fits
    were saved under, and several draws at once are each draw's own network, stacked."""
    torch.manual_seed(0)
    model = RecurrentClassifier(4, hidden=6, num_classes=3, cell=cell, layers=layers)
    assert type(model.net.rnn) is torch_cls and model.net.rnn.batch_first
    names = [f"rnn.{w}_l{k}" for k in range(layers)
             for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]  # fmt: skip
    assert list(model.site_shapes)[: 4 * layers] == names
    g = torch.Generator().manual_seed(1)
    draws = {n: 0.3 * torch.randn(3, *s, generator=g) for n, s in model.site_shapes.items()}
    x = torch.randn(5, 7, 4, generator=g)
    together = model.network(x, draws)
    one_by_one = torch.stack([model.network(x, {n: v[k] for n, v in draws.items()})
                              for k in range(3)])  # fmt: skip
    torch.testing.assert_close(together, one_by_one)
    theirs = torch_cls(4, 6, num_layers=layers, batch_first=True)
    theirs.load_state_dict({n[4:]: v[0] for n, v in draws.items() if n.startswith("rnn.")})
    fc = {n[3:]: v[0] for n, v in draws.items() if n.startswith("fc.")}
    expected = theirs(x)[0][:, -1] @ fc["weight"].T + fc["bias"]
    torch.testing.assert_close(together[0], expected, atol=1e-5, rtol=1e-5)


def test_bad_sizes_are_refused_before_any_weight():
    with pytest.raises(ValueError, match="exactly one of in_features"):
        TransformerClassifier()
    with pytest.raises(ValueError, match="multiple of heads"):
        TransformerClassifier(in_features=3, d_model=10, heads=4)
    with pytest.raises(ValueError, match="cell must be"):
        RecurrentClassifier(3, cell="rnn")
    with pytest.raises(ValueError, match="five convolution widths"):
        AlexNet(widths=(4, 4))


def test_token_inputs_are_checked_by_dtype():
    model = TransformerClassifier(vocab_size=30, d_model=8, heads=2, seq_len=9)
    x, y = torch.randint(0, 30, (16, 9)), torch.randint(0, 10, (16,))
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=2, run=zoo.Run(progress=False))
    assert fit.predict(x[:3], num_samples=2).probs.shape == (3, 10)
    with pytest.raises(TypeError, match="int64"):
        zoo.fit(model, "diagonal", (x.to(torch.int16), y), num_steps=1)
    with pytest.raises(ValueError, match="token id 1\\d\\d at item 0, outside the embedding's"):
        zoo.fit(model, "diagonal", (x + 100, y), num_steps=1)  # tokens past the vocabulary


@pytest.mark.parametrize("estimator", ["local", "flipout"])
def test_per_example_estimators_leave_layers_over_positions_on_the_shared_draw(estimator):
    """A linear layer over a sequence's positions shares its weight across them: the local
    and Flipout estimators serve only linear layers that see one row per example."""
    model = TransformerClassifier(in_features=6, d_model=8, heads=2, layers=1, seq_len=5)
    x, y = torch.randn(16, 5, 6), torch.randint(0, 10, (16,))
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=2,
        loss=zoo.Loss(estimator=estimator),
        run=zoo.Run(progress=False),
    )
    assert fit.options["estimator_sites"] == ["fc.weight"]


def test_networks_with_running_statistics_or_fused_recurrence_run_the_eager_loss():
    """A traced graph would freeze batch norm's buffers: such networks run the eager loss (and
    so no CUDA-graph step), and the fit says why; a fused recurrent layer compiles on the CPU
    only (``tests/zoo/inference/test_compiled.py``)."""
    x, y = torch.randn(16, 1, 12, 12), torch.randint(0, 10, (16,))
    resnet = ResNet(depth=8, in_channels=1, width=4, input_size=12)
    fit = zoo.fit(resnet, "diagonal", (x, y), num_steps=1, run=zoo.Run(progress=False))
    assert "batch-norm running statistics" in str(fit.options["jit"])
    lstm = zoo.models.from_module(nn.Sequential(nn.LSTM(4, 4, batch_first=True)))
    assert compile_refusal(lstm, guides.AutoDiagonal(lstm), 1) is None  # the CPU
    assert "fused recurrent" in compile_refusal(lstm, guides.AutoDiagonal(lstm), 1, "cuda")
