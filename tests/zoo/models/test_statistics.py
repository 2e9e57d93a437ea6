"""Batch norm's running statistics in a Bayesian network, against plain PyTorch."""

import copy

import pytest
import torch
from torch import nn

import guides
import zoo
from zoo.models import frozen_statistics


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


def draws(model, num):
    gen = torch.Generator().manual_seed(1)
    return {n: torch.randn((num, *s), generator=gen) * 0.5 for n, s in model.site_shapes.items()}


def plain_forward(net, weights, x, train=True):
    """``net`` with ``weights`` loaded, in training or evaluation mode, as a PyTorch user runs
    it: returns the output and the net (its running statistics updated)."""
    net = copy.deepcopy(net)
    with torch.no_grad():
        for name, value in weights.items():
            net.get_parameter(name).copy_(value)
    net.train(train)
    with torch.no_grad():
        return net(x), net


def test_one_draw_in_training_mode_is_pytorchs_forward_and_update():
    net = small_net()
    model = zoo.models.from_module(net, init="module")
    x = torch.randn(16, 3)
    w = {n: v[0] for n, v in draws(model, 1).items()}
    out = model.network(x, w)
    expected, ref = plain_forward(net, w, x)
    assert torch.allclose(out, expected, atol=1e-6)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(model.net[1], name), getattr(ref[1], name)), name


def test_vectorised_draws_normalise_alone_and_average_their_updates():
    net = small_net()
    model = zoo.models.from_module(net, init="module")
    x = torch.randn(16, 3)
    w = draws(model, 5)
    out = model.network(x, w)
    momentum, means, variances = net[1].momentum, [], []
    for k in range(5):
        weights = {n: v[k] for n, v in w.items()}
        expected, _ = plain_forward(net, weights, x)
        assert torch.allclose(out[k], expected, atol=1e-5)  # each draw its own batch statistics
        hidden = x @ weights["0.weight"].T + weights["0.bias"]
        means.append(hidden.mean(0))
        variances.append(hidden.var(0, unbiased=True))
    bn = model.net[1]
    mean_of_means = torch.stack(means).mean(0)
    assert torch.allclose(bn.running_mean, momentum * mean_of_means, atol=1e-6)
    mean_of_vars = torch.stack(variances).mean(0)
    assert torch.allclose(bn.running_var, (1 - momentum) + momentum * mean_of_vars, atol=1e-5)
    assert int(bn.num_batches_tracked) == 1


def test_evaluation_mode_reads_the_running_statistics_and_changes_nothing():
    net = small_net()
    model = zoo.models.from_module(net, init="module")
    x = torch.randn(16, 3)
    model.network(x, {n: v[0] for n, v in draws(model, 1).items()})  # move the statistics
    before = copy.deepcopy(model.net[1].state_dict())
    model.eval()
    w = draws(model, 4)
    out = model.network(x, w)
    for k in range(4):
        expected, _ = plain_forward(model.net, {n: v[k] for n, v in w.items()}, x, train=False)
        assert torch.allclose(out[k], expected, atol=1e-5)
    for key, value in model.net[1].state_dict().items():
        assert torch.equal(value, before[key]), key


def test_frozen_statistics_use_the_batch_and_leave_the_running_ones():
    model = zoo.models.from_module(small_net(), init="module")
    x = torch.randn(16, 3)
    w = draws(model, 3)
    before = copy.deepcopy(model.net[1].state_dict())
    with frozen_statistics():
        frozen = model.network(x, w)
        single = model.network(x, {n: v[0] for n, v in w.items()})
    for key, value in model.net[1].state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.allclose(frozen, model.network(x, w), atol=1e-6)  # same batch statistics
    assert torch.allclose(single, frozen[0], atol=1e-5)


def test_a_fit_updates_the_statistics_as_a_hand_written_loop_does():
    """With a point mass and the whole data as one batch, each step's forward pass runs the
    network at the guide's current weights: PyTorch, fed those weights step by step, must end
    with the fit's running statistics (the guide's set-up traces the model without moving
    them), and a prediction reads them as ``model.eval()`` does."""
    net = small_net()
    model = zoo.models.from_module(net, init="module")
    x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    guide = guides.AutoMAP(model)
    with frozen_statistics():  # set up before the fit, to read the starting weights
        guide(x, y)

    def weights():
        return {n: guide.site_posterior(n).loc.detach().clone() for n in guide.site_names}

    seen = [weights()]
    fit = zoo.fit(
        model,
        guide,
        (x, y),
        num_steps=6,
        batch_size=32,
        lr=0.05,
        run=zoo.Run(
            progress=False,
            callbacks=[lambda state: seen.append(weights())],
            statistics="running",  # the steps' own (tests/zoo/training/test_refresh.py: the pass)
        ),
    )
    ref = copy.deepcopy(net)
    ref.train()
    for step in seen[:-1]:  # the weights each step's forward pass ran at
        with torch.no_grad():
            for name, value in step.items():
                ref.get_parameter(name).copy_(value)
            ref(x)
    bn = model.net[1]
    assert int(bn.num_batches_tracked) == 6
    assert torch.allclose(bn.running_mean, ref[1].running_mean, atol=1e-5)
    assert torch.allclose(bn.running_var, ref[1].running_var, atol=1e-5)
    pred = fit.predict(x, num_samples=2)
    expected, _ = plain_forward(model.net, seen[-1], x, train=False)
    assert torch.allclose(pred.sample_probs[0], torch.softmax(expected, -1), atol=1e-5)
    assert model.training  # the model's own mode is back after the fit and the prediction


def test_a_checkpoint_or_file_with_damaged_statistics_is_refused(tmp_path):
    from zoo.storage import files

    model = zoo.models.from_module(small_net(), init="module")
    x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    ckpt = tmp_path / "ckpt.pt"
    fit = zoo.fit(
        model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False, checkpoint=ckpt)
    )
    payload = torch.load(ckpt, weights_only=True)
    payload["model"]["state"]["net.1.running_var"][0] = float("nan")
    payload.pop("checksum", None)
    files.atomic_save(payload, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match="running_var.*NaN|NaN.*running_var"):
        zoo.fit(
            zoo.models.from_module(small_net(), init="module"),
            "diagonal",
            (x, y),
            num_steps=4,
            run=zoo.Run(progress=False, resume=tmp_path / "nan.pt"),
        )
    fit.save(tmp_path / "fit.pt")
    payload = torch.load(tmp_path / "fit.pt", weights_only=True)
    del payload["model"]["state"]["net.1.running_mean"]
    payload.pop("checksum", None)
    files.atomic_save(payload, tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="lacks the network's fitted entries.*running_mean"):
        zoo.load(tmp_path / "missing.pt", model=zoo.models.from_module(small_net(), init="module"))


def test_the_layout_of_mnist_is_checked_before_any_file_is_read(tmp_path):
    with pytest.raises(ValueError, match="layout must be one of"):
        zoo.data.mnist(tmp_path, layout="rows")
