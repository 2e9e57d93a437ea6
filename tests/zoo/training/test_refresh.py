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
    model = zoo.models.from_module(net, bayesian=["3.*"], init="module")
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


def test_a_prediction_during_a_fit_reads_each_draws_own_statistics():
    """Under ``statistics="per_draw"`` the model holds training inputs from before the first
    step: a callback's prediction equals plain PyTorch networks, one per draw, each normalised
    by a pass over them; the fit's steps and its end are those of a fit that holds none."""
    from tests.zoo.models.test_per_draw import by_hand, images, network

    x, y = images()
    probe, seen = images(5, seed=2)[0], []

    def predict(view):
        if view.step == 4:
            held = view.result.model.statistics_inputs
            draws = view.result.sample(3, seed=1)
            got = view.result.predict(probe, num_samples=3, seed=1, progress=False).probs
            seen.append((held.clone(), by_hand(view.result.model, draws, probe, held), got))

    def fitted(statistics, callbacks=()):
        run = zoo.Run(progress=False, statistics=statistics, callbacks=callbacks)
        return zoo.fit(network(), "diagonal", (x, y), num_steps=8, batch_size=16, seed=3, run=run)

    held_fit, plain = fitted("per_draw", [predict]), fitted("refresh")
    held, expected, got = seen[0]
    assert held.shape == x.shape  # all 40 training inputs: fewer than the kept bound
    torch.testing.assert_close(got, expected)
    g = torch.Generator().manual_seed(0)  # drawn by a generator of their own, seeded 0
    torch.testing.assert_close(held, x[torch.randperm(len(x), generator=g)])
    for name, value in plain.guide.state_dict().items():
        torch.testing.assert_close(held_fit.guide.state_dict()[name], value, rtol=0, atol=0)
    assert plain.model.statistics_inputs is None  # "refresh" holds none, during or after


def test_an_interrupted_fit_predicts_with_the_inputs_it_held():
    """Ctrl-C mid-fit: no refresh pass, but the result's predictions still normalise each draw
    with its own statistics, on the inputs held from the start (a sample of the training data,
    bounded by ``kept_size``)."""
    x, y = images(64)

    def interrupt(view):
        if view.step == 3:
            raise KeyboardInterrupt

    model = torch.nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 64, 10),
    )  # fmt: skip
    bayesian = zoo.models.from_module(model, task="classification", init="module")
    run = zoo.Run(progress=False, callbacks=[interrupt])
    result = zoo.fit(bayesian, "diagonal", (x, y), num_steps=10, batch_size=16, run=run)
    assert result.interrupted and "statistics" not in result.options
    assert len(result.model.statistics_inputs) == 64
    own = result.predict(x[:5], num_samples=3, seed=0, progress=False).probs
    result.model.statistics_inputs = None  # every draw reads the steps' running averages
    running_only = result.predict(x[:5], num_samples=3, seed=0, progress=False).probs
    assert not torch.allclose(own, running_only)


def test_inputs_are_sampled_from_every_data_form_alike():
    """Tensors, a map-style Dataset and a DataLoader give the same sample (seeded 0, its own
    generator); an IterableDataset, which cannot be indexed, its first inputs; the fit's
    generators do not move."""
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from zoo.data.batches import fit_batches
    from zoo.runtime.distributed import Ranks

    x, y = images(30)
    model = resnet()

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(zip(x, y))

        def __len__(self):
            return len(x)

    forms = [(x, y), TensorDataset(x, y), DataLoader(TensorDataset(x, y), batch_size=8)]
    samples = []
    for data in [*forms, Stream()]:
        batches, generator = fit_batches(model, data, 8, torch.device("cpu"), 0, Ranks())
        state = generator.get_state()
        before = torch.random.get_rng_state()
        samples.append(batches.sample_inputs(12))
        assert torch.equal(generator.get_state(), state)
        assert torch.equal(torch.random.get_rng_state(), before)
    g = torch.Generator().manual_seed(0)
    expected = x[torch.randperm(len(x), generator=g)[:12]]
    for sample in samples[:3]:
        torch.testing.assert_close(sample, expected)
    torch.testing.assert_close(samples[3], x[:12])


def test_a_checkpoint_leaves_out_the_held_inputs_and_a_resume_holds_them_again(tmp_path):
    """The inputs held mid-fit are not written to a checkpoint (a resume draws the same sample
    again), and the resumed fit ends as one run does."""
    from tests.zoo.models.test_per_draw import images, network
    from zoo.training.checkpoint import read_checkpoint

    x, y = images()
    path = tmp_path / "fit.ckpt"
    seen = []

    def record(view):
        seen.append(view.result.model.statistics_inputs.clone())
        return view.step >= 4 and len(seen) < 5  # the first run stops at step 4

    run = zoo.Run(progress=False, checkpoint=path, callbacks=[record])
    zoo.fit(network(), "diagonal", (x, y), num_steps=8, batch_size=16, run=run)
    assert "statistics_inputs" not in read_checkpoint(path, None)["model"]
    resumed = zoo.fit(network(), "diagonal", (x, y), num_steps=8, batch_size=16,
                      run=zoo.Run(progress=False, resume=path, callbacks=[record]))  # fmt: skip
    assert resumed.steps == 8 and len(seen) == 8
    torch.testing.assert_close(seen[-1], seen[0])  # the same sample, held again
    whole = zoo.fit(network(), "diagonal", (x, y), num_steps=8, batch_size=16,
                    run=zoo.Run(progress=False))  # fmt: skip
    torch.testing.assert_close(resumed.model.statistics_inputs, whole.model.statistics_inputs)


def test_holding_inputs_moves_no_generator_of_a_fit_on_a_dataset():
    """A fit on a Dataset through a DataLoader (whose iterators draw a seed) steps exactly as
    one that holds no inputs: the held sample is drawn by generators of its own."""
    from torch.utils.data import Dataset

    from tests.zoo.models.test_per_draw import images, network

    x, y = images()

    class Digits(Dataset):  # not a TensorDataset: the fit reads it through a DataLoader
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return x[i], y[i]

    data = Digits()

    def fitted(statistics):
        run = zoo.Run(progress=False, statistics=statistics)
        return zoo.fit(network(), "diagonal", data, num_steps=6, batch_size=16, seed=2, run=run)

    held, plain = fitted("per_draw"), fitted("refresh")
    assert len(held.losses) == 6 and held.losses == plain.losses
    for name, value in plain.guide.state_dict().items():
        torch.testing.assert_close(held.guide.state_dict()[name], value, rtol=0, atol=0)
