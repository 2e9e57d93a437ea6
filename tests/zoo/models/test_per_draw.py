"""zoo.models.per_draw: each weight draw normalised with its own batch statistics."""

import copy

import pytest
import torch
from torch import nn

import zoo
from zoo.models import per_draw


def images(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g) * 2 + 1, torch.randint(0, 3, (n,), generator=g)


def network(fixed_first: bool = False):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 36, 3),
    )  # fmt: skip
    if fixed_first:  # a frozen body: the first block's layers fixed, its statistics kept
        net[1].running_mean.fill_(0.3)
        net[0].requires_grad_(False)
        net[1].requires_grad_(False)
        return zoo.models.from_module(
            net, bayesian=["3.*", "7.*"], task="classification", init="module"
        )
    return zoo.models.from_module(net, task="classification", init="module")


def fitted(model, family="diagonal", statistics="per_draw", data=None):
    run = zoo.Run(progress=False, statistics=statistics)
    return zoo.fit(model, family, data or images(), num_steps=30, batch_size=16, seed=0, run=run)


def by_hand(model, draws: dict, x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The mean of the draws' softmax, each draw a plain PyTorch network whose updated batch
    norm layers take their statistics from one training-mode pass over ``kept``."""
    probs = []
    own = dict(model.net.named_parameters())
    for k in range(next(iter(draws.values())).shape[0]):
        net = copy.deepcopy(model.net)
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(draws[name][k] if name in draws else own[name])
        net.train()
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d) and m.weight.requires_grad:
                m.reset_running_stats()
                m.momentum = None
            elif isinstance(m, nn.BatchNorm2d):
                m.eval()  # a fixed layer reads its running statistics
        with torch.no_grad():
            net(kept)
            net.eval()
            probs.append(torch.softmax(net(x), -1))
    return torch.stack(probs).mean(0)


@pytest.mark.parametrize("split", [{}, {"batch_size": 3}, {"sample_batch_size": 4}])
def test_each_draw_reads_its_own_statistics_on_the_kept_inputs(split):
    """The predictive equals plain PyTorch networks, one per draw, each with batch norm's
    statistics of one pass over the kept inputs, however the prediction is split."""
    x, _ = images(7, seed=2)
    fit = fitted(network())
    kept = fit.model.statistics_inputs
    assert fit.options["statistics"] == "per_draw" and kept.shape == (40, 1, 6, 6)
    prediction = fit.predict(x, num_samples=5, seed=3, progress=False, **split)
    expected = by_hand(fit.model, fit.sample(5, seed=3), x, kept)
    torch.testing.assert_close(prediction.probs, expected, rtol=1e-5, atol=1e-6)


def test_the_draws_differ_and_a_frozen_bodys_layers_keep_their_statistics():
    fit = fitted(network(fixed_first=True))
    draws = fit.sample(3, seed=0)
    own = per_draw.draw_statistics(fit.model, draws)
    fixed, updated = own["1.running_mean"], own["4.running_mean"]
    assert torch.equal(fixed, fit.model.net[1].running_mean.expand(3, 4))
    assert not torch.allclose(updated[0], updated[1])
    x, _ = images(5, seed=2)
    prediction = fit.predict(x, num_samples=3, seed=0, progress=False)
    expected = by_hand(fit.model, draws, x, fit.model.statistics_inputs)
    torch.testing.assert_close(prediction.probs, expected, rtol=1e-5, atol=1e-6)


def test_the_loop_for_layers_vmap_cannot_batch_gives_the_same_prediction():
    fit = fitted(network())
    x, _ = images(6, seed=2)
    options = dict(num_samples=4, seed=0, progress=False, sample_batch_size=4)
    vectorised = fit.predict(x, **options).probs
    fit.model._vectorised = False
    torch.testing.assert_close(fit.predict(x, **options).probs, vectorised)


def test_refresh_keeps_no_inputs_and_every_draw_reads_the_running_statistics():
    fit = fitted(network(), statistics="refresh")
    assert fit.model.statistics_inputs is None and fit.options["statistics"] == "refresh"
    x, _ = images(5, seed=2)
    draws = fit.sample(2, seed=0)
    probs = []
    for k in range(2):
        net = copy.deepcopy(fit.model.net).eval()
        with torch.no_grad():
            for name, p in net.named_parameters():
                if name in draws:
                    p.copy_(draws[name][k])
            probs.append(torch.softmax(net(x), -1))
    prediction = fit.predict(x, num_samples=2, seed=0, progress=False)
    torch.testing.assert_close(prediction.probs, torch.stack(probs).mean(0))


def test_a_network_without_batch_norm_keeps_nothing():
    x = torch.randn(32, 3)
    fit = zoo.fit(zoo.models.BayesianMLP(3, (8,)), "diagonal", (x, x.sum(1)), num_steps=5,
                  run=zoo.Run(progress=False))  # fmt: skip
    assert fit.model.statistics_inputs is None


def test_the_kept_inputs_are_bounded_in_number_and_bytes(monkeypatch):
    assert per_draw.kept_size(torch.zeros(10_000, 3)) == per_draw.KEPT_INPUTS
    assert per_draw.kept_size(torch.zeros(7, 3)) == 7
    monkeypatch.setattr(per_draw, "KEPT_BYTES", 4 * 36 * 10)  # ten 6x6 float images
    assert per_draw.kept_size(torch.zeros(40, 1, 6, 6)) == 10
    fit = fitted(network())
    assert len(fit.model.statistics_inputs) == 10
    assert len(per_draw.draw_statistics(fit.model, fit.sample(2))["1.running_mean"]) == 2


def test_a_saved_fit_keeps_its_inputs_and_predicts_alike(tmp_path):
    fit = fitted(network())
    x, _ = images(5, seed=2)
    path = fit.save(tmp_path / "fit.zoo")
    back = zoo.load(path, model=network())
    torch.testing.assert_close(back.model.statistics_inputs, fit.model.statistics_inputs)
    before = fit.predict(x, num_samples=3, progress=False).probs
    torch.testing.assert_close(back.predict(x, num_samples=3, progress=False).probs, before)


def test_a_save_says_what_training_data_it_holds_and_can_hold_none(tmp_path):
    """``training_data()`` lists the kept inputs, on the fit and on the loaded file; with
    ``save(training_data=False)`` the file holds no input of the training data, and the loaded
    fit predicts as the same fit with ``statistics="refresh"`` does: every draw normalised
    with the running statistics, re-estimated at the end of the fit."""
    import pickletools
    import zipfile

    fit = fitted(network())
    x, _ = images(5, seed=2)
    held = {"file['model']['statistics_inputs']": (40, 1, 6, 6)}
    assert fit.training_data() == held
    kept = fit.save(tmp_path / "kept.zoo")
    assert zoo.load(kept, model=network()).training_data() == held
    bare = fit.save(tmp_path / "bare.zoo", training_data=False)
    back = zoo.load(bare, model=network())
    assert back.training_data() == {} and back.model.statistics_inputs is None
    with zipfile.ZipFile(bare) as archive:  # nothing of the inputs' size in the file
        sizes = [i.file_size for i in archive.infolist() if "/data/" in i.filename]
        opcodes = pickletools.genops(archive.read(next(n for n in archive.namelist()
                                                       if n.endswith("data.pkl"))))  # fmt: skip
        assert "statistics_inputs" not in [arg for _, arg, _ in opcodes]
    assert 40 * 36 * 4 not in sizes
    refreshed = fitted(network(), statistics="refresh")
    expected = refreshed.predict(x, num_samples=3, progress=False).probs
    torch.testing.assert_close(back.predict(x, num_samples=3, progress=False).probs, expected)
    with pytest.raises(TypeError, match="training_data must be True or False"):
        fit.save(tmp_path / "x.zoo", training_data="no")


@pytest.mark.parametrize(
    "bad,match",
    [
        (torch.full((4, 1, 6, 6), float("nan")), "not finite"),
        (torch.zeros(0, 1, 6, 6), "non-empty"),
    ],
)
def test_changed_kept_inputs_are_refused_before_the_model_holds_any_of_the_file(bad, match):
    from zoo.storage import model_form

    payload = model_form.model_payload(fitted(network()).model)
    payload["statistics_inputs"] = bad
    model = network()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=match):
        model_form.restore_model(payload, model)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert model.statistics_inputs is None


def test_a_later_fit_drops_a_former_fits_inputs():
    model = network()
    fitted(model)
    assert model.statistics_inputs is not None
    fitted(model, statistics="running")
    assert model.statistics_inputs is None


def test_a_fit_stopped_and_resumed_keeps_what_one_run_keeps(tmp_path):
    """Stopped at step 15 (its checkpoint written) and resumed to 30: the same kept inputs
    and the same prediction as one uninterrupted run."""
    path = tmp_path / "fit.ckpt"
    whole = fitted(network())
    stop = zoo.Run(progress=False, checkpoint=path, callbacks=[lambda view: view.step >= 15])
    zoo.fit(network(), "diagonal", images(), num_steps=30, batch_size=16, seed=0, run=stop)
    resumed = zoo.fit(network(), "diagonal", images(), num_steps=30, batch_size=16, seed=0,
                      run=zoo.Run(progress=False, resume=path))  # fmt: skip
    assert resumed.steps == 30
    torch.testing.assert_close(resumed.model.statistics_inputs, whole.model.statistics_inputs)
    x, _ = images(5, seed=2)
    torch.testing.assert_close(
        resumed.predict(x, num_samples=3, progress=False).probs,
        whole.predict(x, num_samples=3, progress=False).probs,
    )


def test_predictions_from_two_threads_match_one_and_leave_the_layers_as_they_were():
    import threading

    fit = fitted(network())
    x, _ = images(6, seed=2)
    alone = fit.predict(x, num_samples=4, progress=False).probs
    got, errors = [], []

    def predict():
        try:
            for _ in range(3):
                got.append(fit.predict(x, num_samples=4, progress=False).probs)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=predict) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and not errors
    assert len(got) == 6 and all(torch.equal(p, alone) for p in got)
    norms = [m for m in fit.model.net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert {m.momentum for m in norms} == {0.1}


def test_a_pass_failing_midway_leaves_the_layers_their_momenta_statistics_and_modes():
    """The third draw's pass of the kept inputs fails: the error reaches the caller, and every
    layer's momentum, running statistics and mode are as before; the next prediction is the
    one the model made before the failure."""
    fit = fitted(network(fixed_first=True))
    net = fit.model.net
    x, _ = images(5, seed=2)
    before = fit.predict(x, num_samples=4, seed=0, progress=False).probs
    buffers = {n: b.clone() for n, b in net.named_buffers()}
    modes = [m.training for m in net.modules()]
    calls = []

    kept = len(fit.model.statistics_inputs)

    def fail_on_the_third_draw(module, args):
        if len(args[0]) == kept:  # a pass of the kept inputs, not the prediction's own
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("a pass that fails midway")

    handle = net[3].register_forward_pre_hook(fail_on_the_third_draw)
    try:
        with pytest.raises(RuntimeError, match="fails midway"):
            fit.predict(x, num_samples=4, seed=0, progress=False)
    finally:
        handle.remove()
    assert len(calls) == 3 and kept == 40
    norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [m.momentum for m in norms] == [0.1, 0.1]
    assert all(torch.equal(b, buffers[n]) for n, b in net.named_buffers())
    assert [m.training for m in net.modules()] == modes
    after = fit.predict(x, num_samples=4, seed=0, progress=False).probs
    torch.testing.assert_close(after, before)


class _Gate(nn.Module):
    """A layer ``torch.func.vmap`` cannot batch: it reads a value with ``.item()``."""

    def forward(self, x):
        return x * (1.0 if x.abs().max().item() >= 0 else 0.0)


def test_a_layer_vmap_cannot_batch_turns_the_model_to_the_loop_once():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), _Gate(), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 36, 3),
    )  # fmt: skip
    fit = fitted(zoo.models.from_module(net, task="classification", init="module"))
    x, _ = images(5, seed=2)
    prediction = fit.predict(x, num_samples=4, seed=0, progress=False, sample_batch_size=4)
    assert fit.model._vectorised is False  # the next call goes straight to the loop
    expected = by_hand(fit.model, fit.sample(4, seed=0), x, fit.model.statistics_inputs)
    torch.testing.assert_close(prediction.probs, expected, rtol=1e-5, atol=1e-6)
