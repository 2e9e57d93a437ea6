"""zoo.training.refresh: batch norm's running statistics re-estimated at the end of a fit."""

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn

import zoo
from guides.checks import InvalidArgument
from zoo.results.laplace_torch import network_at
from zoo.training import refresh


def images(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g) * 2 + 1, torch.randint(0, 10, (n,), generator=g)


def resnet():
    torch.manual_seed(0)
    return zoo.models.ResNet(8, in_channels=1, input_size=8, width=4)


def fit(model, family="map", statistics="refresh", data=None, **options):
    options = {"num_steps": 12, "batch_size": 64, "lr": 0.05, **options}
    return zoo.fit(model, family, data or images(), run=zoo.Run(progress=False,
                   statistics=statistics), **options)  # fmt: skip


def running(net):
    return {n: b.clone() for n, b in net.named_buffers() if "running" in n}


def test_a_map_fits_statistics_are_torchs_update_bn_at_its_weights():
    """One full batch: the refreshed statistics are what PyTorch's own ``update_bn`` (SWA)
    computes for the plain network at the MAP weights, not the steps' running averages."""
    x, y = images()
    result = fit(resnet(), data=(x, y))
    assert result.options["statistics"] == "refresh"
    net = network_at(result.model, {k: v[0] for k, v in result.sample(1).items()})
    update_bn([(x,)], net)
    expected, got = running(net), running(result.model.net)
    assert expected.keys() == got.keys() and expected
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
    kept = fit(resnet(), statistics="running", data=(x, y))
    assert "statistics" not in kept.options
    assert any(not torch.allclose(kept.model.net.get_buffer(n), expected[n]) for n in expected)


def test_the_pass_changes_no_parameter_and_no_loss():
    refreshed, kept = fit(resnet(), "diagonal"), fit(resnet(), "diagonal", "running")
    assert refreshed.losses == kept.losses
    for name, value in kept.guide.state_dict().items():
        assert torch.equal(value, refreshed.guide.state_dict()[name]), name
    momenta = {m.momentum for m in refreshed.model.net.modules() if isinstance(m, nn.BatchNorm2d)}
    assert momenta == {0.1}  # the layers' own momentum back


def test_a_frozen_bodys_statistics_are_kept():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 10))
    net[1].running_mean.fill_(0.3)
    net[0].requires_grad_(False)
    net[1].requires_grad_(False)
    model = zoo.models.from_module(net, bayesian=["3.*"])
    before = running(model.net)
    result = fit(model, "diagonal")
    assert "statistics" not in result.options  # no layer the steps update
    for name, value in before.items():
        assert torch.equal(value, result.model.net.get_buffer(name)), name


def test_a_network_without_running_statistics_is_left_alone():
    x = torch.randn(32, 3)
    result = zoo.fit(zoo.models.BayesianMLP(3, (8,)), "diagonal", (x, x.sum(1)), num_steps=5,
                     run=zoo.Run(progress=False))  # fmt: skip
    assert "statistics" not in result.options


def test_a_pass_that_fails_puts_the_statistics_back(monkeypatch):
    result = fit(resnet(), statistics="running")
    before = running(result.model.net)
    objective = zoo.Objective(result.model, result.guide)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(objective, "loss", failing)
    batches = [images()]

    class Batches:
        def epoch(self, e):
            return iter(batches)

        def __len__(self):
            return 64

    with pytest.raises(RuntimeError, match="out of memory"):
        refresh.refresh_statistics(objective, Batches())
    assert calls
    for name, value in before.items():
        assert torch.equal(value, result.model.net.get_buffer(name)), name
    assert {m.momentum for m in result.model.net.modules() if isinstance(m, nn.BatchNorm2d)} == {
        0.1
    }


@pytest.mark.parametrize("bad", ["fresh", None, 1])
def test_an_unknown_choice_is_refused_naming_the_choices(bad):
    choices = "statistics must be one of 'per_draw', 'refresh', 'running'"
    with pytest.raises(InvalidArgument, match=choices):
        zoo.Run(statistics=bad)
