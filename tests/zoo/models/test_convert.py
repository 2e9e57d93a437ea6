"""``zoo.models.from_module``: any network, which parameters are sites, and its refusals."""

import pytest
import torch
from torch import nn

import guides
import zoo
from tests.families import PRIMARY
from tests.trained import trained_cnn
from zoo.models import from_module

QUIET = zoo.Run(progress=False)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten()
        )
        self.norm = nn.LayerNorm(4 * 6 * 6)
        self.token = nn.Parameter(torch.zeros(4 * 6 * 6))
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(self.norm(self.body(x)) + self.token)


def test_default_rule_normalisation_deterministic_everything_else_a_site():
    model = from_module(Head(), init="module")
    assert sorted(model.deterministic) == [
        "body.1.bias",
        "body.1.weight",
        "norm.bias",
        "norm.weight",
    ]
    assert sorted(model.site_shapes) == [
        "body.0.bias",
        "body.0.weight",
        "fc.bias",
        "fc.weight",
        "token",
    ]
    params = dict(model.named_parameters())
    assert params["net.body.1.weight"].requires_grad  # fitted with the ELBO
    assert not params["net.fc.weight"].requires_grad  # a site: the guide holds it
    assert isinstance(model.net.body[3], nn.Identity)  # dropout is left to the posterior


def test_patterns_choose_the_sites():
    net = Head()
    model = from_module(net, bayesian=["fc.*"], init="module")
    assert sorted(model.site_shapes) == ["fc.bias", "fc.weight"]
    model = from_module(net, deterministic=["token", "body.0.*"], init="module")
    assert sorted(model.site_shapes) == ["fc.bias", "fc.weight"]
    model = from_module(net, bayesian=["*"], deterministic=["fc.bias"], init="module")
    assert "body.1.weight" in model.site_shapes and "fc.bias" in model.deterministic


def test_a_bayesian_last_layer_on_a_fixed_trained_body_is_one_call():
    net = Head()
    net.requires_grad_(False)
    model = from_module(net, bayesian=["fc.*"], init="module")
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
    before = {n: p.clone() for n, p in model.net.named_parameters()}
    fit = zoo.fit(model, "lowrank", (x, y), num_steps=5, lr=0.1, run=zoo.Run(progress=False))
    for name in model.deterministic + ("body.0.weight", "token"):
        assert torch.equal(dict(model.net.named_parameters())[name], before[name]), name
    assert fit.guide.site_names == ["fc.weight", "fc.bias"]
    trainable = from_module(Head(), bayesian=["fc.*"], init="module")
    zoo.fit(trainable, "diagonal", (x, y), num_steps=5, lr=0.1, run=zoo.Run(progress=False))
    moved = dict(trainable.net.named_parameters())["body.0.weight"]
    assert not torch.equal(moved, Head().body[0].weight)  # a trainable body is fitted


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(bayesian=["fc2.*"]), ValueError, "pattern 'fc2.\\*' matches no parameter"),
        (dict(bayesian="fc.*"), TypeError, "write \\['fc.\\*'\\]"),
        (dict(deterministic=[3]), TypeError, "patterns are strings"),
        (dict(bayesian=["norm.*"], deterministic=["norm.*"]), ValueError, "no parameter"),
    ],
)
def test_bad_patterns_are_refused_naming_what_to_write(kwargs, error, match):
    with pytest.raises(error, match=match):
        from_module(Head(), **kwargs, init="module")


def test_not_a_module_and_a_module_without_parameters_are_refused():
    with pytest.raises(TypeError, match="needs an nn.Module"):
        from_module(lambda x: x, init="module")
    with pytest.raises(ValueError, match="no parameters"):
        from_module(nn.ReLU(), init="module")


def test_the_users_module_is_not_changed():
    net = Head().eval()
    from_module(net, init="module")
    assert isinstance(net.body[3], nn.Dropout) and not net.training
    assert all(p.requires_grad for p in net.parameters())


@pytest.mark.parametrize("family", guides.available())
def test_every_family_serves_every_parameter_shape(family):
    """Conv kernels, embeddings, attention's packed in-projection, recurrent weights, 1-D
    vectors: every family sets up on them (or gives a 1-D site its fallback) and fits."""

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 2)
            self.emb = nn.Embedding(11, 4)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
            self.rnn = nn.GRU(4, 4, batch_first=True)
            self.scale = nn.Parameter(torch.ones(4))
            self.fc = nn.Linear(4, 2)

        def forward(self, tokens):
            h = self.emb(tokens)
            h = h + self.conv(h.transpose(1, 2)).transpose(1, 2).mean(1, keepdim=True)
            h = self.attn(h, h, h, need_weights=False)[0]
            return self.fc(self.rnn(h)[0][:, -1] * self.scale)

    model = from_module(Mixed(), init="module")
    assert {n: tuple(s) for n, s in model.site_shapes.items() if "in_proj" in n or "ih" in n} == {
        "attn.in_proj_weight": (12, 4),
        "attn.in_proj_bias": (12,),
        "rnn.weight_ih_l0": (12, 4),
        "rnn.bias_ih_l0": (12,),
    }
    x, y = torch.randint(0, 11, (8, 5)), torch.randint(0, 2, (8,))
    fit = zoo.fit(model, family, (x, y), num_steps=2, run=zoo.Run(progress=False))
    assert fit.predict(x, num_samples=2).probs.shape == (8, 2)


def test_the_matrix_families_view_every_shape_as_the_table_says():
    """Matrix normal and WHVI take ``(s0, s1 s2 ...)``: rows are tokens, q/k/v units or gate
    units, columns their inputs (a kernel's ``in kh kw``); 1-D sites take the diagonal."""

    class Shapes(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 4)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
            self.rnn = nn.LSTM(4, 5, batch_first=True)
            self.conv = nn.Conv1d(5, 3, 2)

        def forward(self, tokens):
            h = self.emb(tokens)
            h = self.rnn(h + self.attn(h, h, h, need_weights=False)[0])[0]
            return self.conv(h.transpose(1, 2)).mean(-1)

    model = from_module(Shapes(), init="module")
    x, y = torch.randint(0, 11, (2, 5)), torch.randint(0, 3, (2,))
    mn = guides.AutoMatrixNormal(model)
    mn(x, y)
    views = {
        "emb.weight": (11, 4),
        "attn.in_proj_weight": (12, 4),
        "rnn.weight_ih_l0": (20, 4),
        "rnn.weight_hh_l0": (20, 5),
        "conv.weight": (3, 10),
    }
    for name, (rows, cols) in views.items():
        site = mn.site_posterior(name)
        assert tuple(site.row_raw.shape) == (rows, rows), name
        assert tuple(site.col_raw.shape) == (cols, cols), name
    assert type(mn.site_posterior("rnn.bias_ih_l0")).__name__ == "DiagonalSite"
    whvi = guides.AutoWHVI(model)  # the default blocks of D = 4
    whvi(x, y)
    layout = whvi.site_posterior("rnn.weight_ih_l0").layout  # 20 x 4: 5 x 1 blocks
    assert (layout.blocks, layout.size, layout.cols) == (5, 4, 4)
    layout = whvi.site_posterior("conv.weight").layout  # 3 x 10: 1 x 3 blocks
    assert (layout.blocks, layout.size, layout.cols) == (3, 4, 10)
    paper = guides.AutoWHVI(model, block_size=None)  # one block as wide as the weight
    paper(x, y)
    layout = paper.site_posterior("rnn.weight_ih_l0").layout  # 20 x 4: blocks of D = 4
    assert (layout.blocks, layout.size, layout.cols) == (5, 4, 4)
    layout = paper.site_posterior("conv.weight").layout  # 3 x 10: one block of D = 16
    assert (layout.blocks, layout.size, layout.cols) == (1, 16, 10)


@pytest.fixture
def trained():
    return trained_cnn()


def _metrics(probs, y):
    return zoo.metrics.accuracy(probs, y), zoo.metrics.nll(probs, y)


@pytest.mark.parametrize("family", sorted(set(PRIMARY) - {"whvi"}))
def test_every_family_starts_at_the_trained_weights(trained, family):
    net, (x, y), _ = trained
    model = from_module(net, init="module")
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
    whvi = guides.get("whvi")(from_module(net, init="module"))
    fresh = guides.get("diagonal")(from_module(net, init="fresh"))
    kaiming = guides.get("diagonal")(from_module(net, init="module"), init_loc_fn="kaiming")
    for guide in (whvi, fresh, kaiming):
        with zoo.models.frozen_statistics():
            guide(x[:4], y[:4])
        assert not torch.allclose(guide.median()["5.weight"], net[5].weight, atol=1e-3)


def test_a_short_default_fit_keeps_the_trained_accuracy_and_nll(trained):
    net, data, (xt, yt) = trained
    with torch.no_grad():
        acc0, nll0 = _metrics(net(xt).softmax(-1), yt)
    assert acc0 > 0.9  # the network learned the task
    fit = zoo.fit(from_module(net, init="module"), "diagonal", data, num_steps=30, run=QUIET)
    pred = fit.predict(xt, num_samples=20, progress=False)
    acc, nll = _metrics(pred.probs, yt)
    assert acc >= acc0 - 0.02 and nll <= nll0 + 0.05, (acc0, nll0, acc, nll)
    fresh = zoo.fit(from_module(net, init="fresh"), "diagonal", data, num_steps=30, run=QUIET)
    _, nll_fresh = _metrics(fresh.predict(xt, num_samples=20, progress=False).probs, yt)
    assert nll_fresh > nll + 0.05  # a fresh start (the old default) has not caught up


def test_stochastic_layers_are_removed_by_one_rule():
    from torchvision.ops import StochasticDepth

    net = nn.Sequential(nn.Linear(4, 4), StochasticDepth(0.5, "row"), nn.Dropout(0.3))
    net.append(nn.Linear(4, 2))
    model = from_module(net, init="module")
    assert isinstance(model.net[1], nn.Identity) and isinstance(model.net[2], nn.Identity)
    assert isinstance(net[1], StochasticDepth)  # the user's module is unchanged
    x = torch.randn(8, 4)
    params = model.net_means()
    with torch.no_grad():  # training mode: a random layer left would differ between calls
        torch.testing.assert_close(model.network(x, params), model.network(x, params))


@pytest.mark.parametrize("shape", [(-3,), (0, 4), "28", (2.5,)])
def test_a_bad_input_shape_is_refused(shape):
    with pytest.raises(ValueError, match="input_shape must be a tuple of sizes"):
        from_module(nn.Linear(3, 2), input_shape=shape, init="module")


def test_init_must_be_module_or_fresh():
    with pytest.raises(ValueError, match="init must be 'module'"):
        from_module(nn.Linear(3, 2), init="trained")
    with pytest.raises(ValueError, match="init_loc_fn must be 'auto', 'kaiming'"):
        guides.AutoDiagonal(from_module(nn.Linear(3, 2), init="module"), init_loc_fn="module")


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, mask):
        return self.fc(x * mask)


class _Branchy(nn.Module):
    """A forward that reads a weight's value: no meta tensor or vmap can run it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        sign = 1.0 if self.fc.weight.sum().item() > 0 else -1.0
        return sign * self.fc(x)


def test_a_forward_that_needs_a_second_argument_is_refused_when_converted():
    with pytest.raises(TypeError, match=r"_Masked.forward takes \(x, mask\).*one input"):
        from_module(_Masked(), init="module")
    with pytest.raises(TypeError, match="MultiheadAttention.forward takes"):
        from_module(nn.MultiheadAttention(4, 2), init="module")


def test_a_forward_that_reads_a_weights_value_fits_and_predicts():
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    model = from_module(_Branchy(), init="module")
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=2, loss=zoo.Loss(num_particles=3),
                  run=QUIET)  # fmt: skip
    batched = fit.predict(x, num_samples=4, sample_batch_size=4, seed=0, progress=False)
    one_by_one = fit.predict(x, num_samples=4, seed=0, progress=False)
    torch.testing.assert_close(batched.probs, one_by_one.probs)


def test_a_network_too_large_for_memory_is_refused_with_the_gib_it_needs():
    huge = nn.Linear(10**6, 10**6, device="meta")  # 1e12 weights, no memory held
    with pytest.raises(ValueError, match=r"needs at least [\d,.]+ GiB .* where this machine"):
        from_module(huge, init="module")
    assert from_module(huge, bayesian=["bias"], init="module").site_shapes == {"bias": (10**6,)}


def test_net_means_copies_unless_asked_for_views():
    """The checks probe the network on its own weights without copying them (a copy per
    probe is the network's size again); the means a guide starts from are copies."""
    embed = torch.nn.Sequential(torch.nn.Embedding(5, 3, padding_idx=0), torch.nn.Flatten(),
                                torch.nn.Linear(6, 2))  # fmt: skip
    model = from_module(embed, task="classification", init="module")
    params = dict(model.net.named_parameters())
    views, copies = model.net_means(copy=False), model.net_means()
    for name, view in views.items():
        assert torch.equal(view, copies[name])
        own = params[name].untyped_storage().data_ptr()
        assert copies[name].untyped_storage().data_ptr() != own
        if name != "0.weight":  # the padded embedding's site leaves a row out: a new tensor
            assert view.untyped_storage().data_ptr() == own
    assert views["0.weight"].shape == (4, 3)  # the padding row is not part of the site
