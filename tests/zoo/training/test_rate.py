"""zoo.training.rate: the learning-rate range test that chooses a fit's rate when none is given."""

import math

import pytest
import torch

import guides
import zoo
from zoo.data.batches import fit_batches
from zoo.runtime.distributed import Ranks
from zoo.storage import files
from zoo.training import rate, rate_rule
from zoo.training import warmup as warmup_states
from zoo.training.optim import optimizer_at
from zoo.training.rate import (
    HIGH,
    LOW,
    MAX_TEST_STEPS,
    MIN_FIT_STEPS,
    MIN_TEST_STEPS,
    sweep_length,
)
from zoo.training.recipes import DEFAULT_LR


def classification(n=640, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return x, y


def model():
    return zoo.models.BayesianMLP(6, (16,), 3, task="classification")


def fit(guide="diagonal", data=None, **options):
    run = zoo.Run(progress=False, **options.pop("run", {}))
    options.setdefault("num_steps", 80)
    options.setdefault("batch_size", 32)
    options.setdefault("loss", {"map_start": False})  # the family's own test, from its start
    return zoo.fit(model(), guide, data if data is not None else classification(), run=run,
                   **options)  # fmt: skip


# ---- the rule ------------------------------------------------------------------------------


def test_the_sweep_is_a_sixth_of_the_fit_within_bounds():
    assert sweep_length(MIN_FIT_STEPS - 1) is None
    assert sweep_length(MIN_FIT_STEPS) == MIN_TEST_STEPS
    assert sweep_length(600) == min(MAX_TEST_STEPS, 600 // 6)
    assert sweep_length(10**6) == MAX_TEST_STEPS


# ---- in a fit ------------------------------------------------------------------------------


def test_a_default_fit_measures_its_rate_and_charges_the_steps():
    result = fit(num_steps=96)
    test = result.options["lr_test"]
    assert result.options["lr_rule"] == "range test"
    assert result.options["recipe"] == "given, rate measured"
    assert len(test["losses"]) == test["steps"] <= sweep_length(96) == 16
    assert result.steps + test["steps"] == 96 == result.fitting()["steps"]
    assert result.options["num_steps"] == 96 - test["steps"]
    assert result.options["lr"] == test["lr"] > 0
    assert test["base"] == DEFAULT_LR  # the diagonal family's scale is 1
    assert test["rates"][0] == pytest.approx(DEFAULT_LR / LOW)
    assert max(test["rates"]) <= DEFAULT_LR * HIGH * (1 + 1e-9)
    assert len(test["losses"]) == len(test["data_losses"]) == len(test["rates"])
    assert all(d < loss for d, loss in zip(test["data_losses"], test["losses"]))  # KL > 0
    assert test["seconds"] > 0 and result.wall_time >= test["seconds"]


def test_the_fit_after_the_test_is_the_fit_given_that_rate(monkeypatch):
    """With no sweep state held (no memory for one), the sweep puts back the parameters and
    every generator: what follows is, draw for draw, the fit given the chosen rate for the
    steps left (decaying tenfold, the default)."""
    monkeypatch.setattr(warmup_states, "WARMUP_MEMORY", -1)
    measured = fit(num_steps=96)
    test = measured.options["lr_test"]
    assert test["kept"] == 0
    given = fit(num_steps=96 - test["steps"], lr=test["lr"],
                optim=zoo.Optim(lr_schedule="exponential"))  # fmt: skip
    assert measured.losses == given.losses
    for name, value in measured.guide.state_dict().items():
        assert torch.equal(value, given.guide.state_dict()[name]), name


def resnet_problem():
    torch.manual_seed(0)
    m = zoo.models.ResNet(8, in_channels=1, input_size=8, width=4)  # batch norm's statistics
    x = torch.randn(96, 1, 8, 8)
    y = torch.randint(0, 10, (96,))
    guide = guides.registry.get("diagonal")(m)
    objective = zoo.Objective(m, guide)
    objective.setup(x[:2], y[:2])
    batches, generator = fit_batches(m, (x, y), 32, torch.device("cpu"), 3, Ranks())
    return m, guide, objective, batches, generator


def replay(steps, rates, base=1e-3):
    """An independent replay of a sweep's first ``steps`` steps: Adam at ``rates`` on the
    same minibatches and draws, written out without the step engine."""
    m, guide, objective, batches, generator = resnet_problem()
    opt = optimizer_at(base, objective, zoo.Optim())
    stream = (b for epoch in range(10) for b in batches.epoch(epoch))
    for i in range(steps):
        x, y = next(stream)
        for group in opt.param_groups:
            group["lr"] = rates[i]
        opt.zero_grad(set_to_none=True)
        objective.loss(x, y, len(batches), step=0, eager=True).backward()
        opt.step()
    return m, guide


def test_the_sweep_keeps_its_steps_up_to_the_chosen_rate_and_puts_back_the_generators():
    """The fit goes on from the state after the sweep's steps at rates up to the chosen one
    (parameters, running statistics, the optimiser's moments), as an independent replay of
    those steps ends; the generators are put back to where the sweep began."""
    m, guide, objective, batches, generator = resnet_problem()
    shuffle, rng = generator.get_state(), torch.get_rng_state()
    opt = optimizer_at(1e-3, objective, zoo.Optim())
    test = rate.run_test(objective, batches, opt, base=1e-3, steps=16, generator=generator)
    assert 3 <= test.steps <= 16
    assert 0 < test.kept < test.steps
    assert test.kept == sum(r <= test.lr * (1 + 1e-9) for r in test.rates)
    assert torch.equal(generator.get_state(), shuffle) and torch.equal(torch.get_rng_state(), rng)
    assert all(g["lr"] == pytest.approx(test.lr) for g in opt.param_groups)
    assert all(s["step"] == test.kept for s in opt.state.values())
    torch.set_rng_state(rng)
    m2, guide2 = replay(test.kept, test.rates)
    after, replayed = (
        {**guide.state_dict(), **m.state_dict()},
        {**guide2.state_dict(), **m2.state_dict()},
    )
    for name, value in replayed.items():
        assert torch.allclose(value.float(), after[name].float(), rtol=1e-5, atol=1e-6), name


def test_a_sweep_with_no_memory_for_its_states_puts_back_its_start(monkeypatch):
    monkeypatch.setattr(warmup_states, "WARMUP_MEMORY", -1)
    m, guide, objective, batches, generator = resnet_problem()
    before = {k: v.clone() for k, v in {**guide.state_dict(), **m.state_dict()}.items()}
    opt = optimizer_at(1e-3, objective, zoo.Optim())
    test = rate.run_test(objective, batches, opt, base=1e-3, steps=16, generator=generator)
    assert test.kept == 0
    after = {**guide.state_dict(), **m.state_dict()}
    for name, value in before.items():
        assert torch.equal(value, after[name]), name
    assert not opt.state  # the optimiser's moments too: a fresh start


def test_a_sweep_stops_once_its_data_term_climbs_back_above_its_start():
    assert not rate_rule.climbed_back([5.0, 4.0, 3.0, 4.0], 6)
    assert rate_rule.climbed_back([5.0, 4.0, 3.0, 9.0, 20.0], 6)
    assert not rate_rule.climbed_back([5.0, 6.0, 7.0], 4)  # never fell: no minimum to read yet
    assert rate_rule.climbed_back([-1.0, -2.0, -3.0, 5.0, 9.0], 6)  # a regression's may be negative
    # noise at the lowest rates (a dip, then back above the start) does not end a sweep
    assert not rate_rule.climbed_back([1.0, 0.98, 1.05], 16)
    assert not rate_rule.climbed_back([1.0, 0.98, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5], 16)
    assert rate_rule.climbed_back([1.0, 0.98, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], 16)
    result = fit(num_steps=96)  # a sweep stops at the first step the rule says, if any
    test, length = result.options["lr_test"], sweep_length(96)
    losses = test["data_losses"]
    assert not any(rate_rule.climbed_back(losses[:k], length) for k in range(1, test["steps"]))
    assert test["steps"] == length or rate_rule.climbed_back(losses, length)


def test_the_choice_is_seeded():
    a, b = fit(num_steps=80, seed=4), fit(num_steps=80, seed=4)
    seconds = {"seconds": a.options["lr_test"]["seconds"]}
    assert a.options["lr_test"] == {**b.options["lr_test"], **seconds}
    c = fit(num_steps=80, seed=5)
    assert c.options["lr_test"]["losses"] != a.options["lr_test"]["losses"]


def test_a_resumed_fit_takes_its_rate_from_the_checkpoint_and_ends_where_one_run_ends(
    tmp_path, monkeypatch
):
    whole = fit(num_steps=96)
    path = tmp_path / "fit.ckpt"
    stop_at = 40

    def stop(view):
        return view.step >= stop_at

    first = fit(num_steps=96, run={"checkpoint": path, "checkpoint_every": 10, "callbacks": [stop]})
    assert first.steps == stop_at and first.options["lr_test"] == {
        **whole.options["lr_test"], "seconds": first.options["lr_test"]["seconds"]}  # fmt: skip

    def no_sweep(*args, **kwargs):
        raise AssertionError("a resumed fit does not sweep again")

    monkeypatch.setattr(rate, "run_test", no_sweep)
    resumed = fit(num_steps=96, run={"resume": path})
    assert resumed.options["lr"] == whole.options["lr"]
    assert resumed.losses == whole.losses
    for name, value in whole.guide.state_dict().items():
        assert torch.allclose(value, resumed.guide.state_dict()[name]), name


@pytest.mark.parametrize(
    "options, rule",
    [
        ({"lr": 0.01}, "given"),
        ({"num_steps": 40}, "default (fit too short to measure)"),
        (
            {"num_steps": zoo.Convergence(window=20, cap=80)},
            "default (a convergence rule's constant rate)",
        ),  # fmt: skip
    ],
)
def test_no_sweep_where_the_rate_is_given_or_cannot_be_measured(options, rule):
    result = fit(**{"num_steps": 80, **options})
    assert "lr_test" not in result.options
    assert result.options["lr_rule"] == rule
    assert result.fitting()["lr_rule"] == rule


def test_auto_on_a_fit_too_short_is_refused_before_any_step():
    calls = []
    with pytest.raises(ValueError, match=r'lr="auto" measures .* only 40 step\(s\)'):
        fit(num_steps=40, lr="auto", run={"callbacks": [lambda v: calls.append(v)]})
    assert not calls
    result = fit(num_steps=80, lr="auto")  # long enough: measured
    assert result.options["lr_rule"] == "range test"


def test_auto_on_data_too_small_for_the_test_says_so():
    """One epoch of 48 examples at batch 16 is 3 steps: the sweep alone would need 16."""
    with pytest.raises(ValueError, match="at least 64 are needed"):
        fit("diagonal", classification(48), num_steps=None, epochs=1, batch_size=16, lr="auto")


@pytest.mark.parametrize("bad", ["fast", -1, 0, float("nan")])
def test_a_rate_that_is_neither_a_number_nor_auto_is_refused(bad):
    with pytest.raises(ValueError, match="lr must be a positive number"):
        fit(lr=bad)


def test_accumulated_steps_sweep_with_the_same_minibatches_a_step():
    result = fit(num_steps=80, engine=zoo.Engine(accumulate=2))
    assert result.options["lr_rule"] == "range test"
    assert result.steps + result.options["lr_test"]["steps"] == 80


def test_a_trained_start_keeps_the_fine_tune_rate():
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    converted = zoo.models.from_module(net, task="classification", init="module")
    result = zoo.fit(converted, "diagonal", classification(), num_steps=80, batch_size=32,
                     run=zoo.Run(progress=False))  # fmt: skip
    assert "lr_test" not in result.options
    assert result.options["lr_rule"] == "default (trained start)"


def test_a_sweep_that_blows_up_stops_there_and_puts_everything_back():
    """Rates from 1e3: the loss turns non-finite within a few steps; the sweep stops there
    (bounded by the first non-finite step, not its length), and the state is put back."""
    m = model()
    x, y = classification()
    guide = guides.registry.get("diagonal")(m)
    objective = zoo.Objective(m, guide)
    objective.setup(x[:2], y[:2])
    batches, generator = fit_batches(m, (x, y), 32, torch.device("cpu"), 0, Ranks())
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    opt = optimizer_at(1e4, objective, zoo.Optim())
    test = rate.run_test(objective, batches, opt, base=1e4, steps=60, generator=generator)
    assert test.steps < 60 and not math.isfinite(test.losses[-1])
    assert all(math.isfinite(v) for v in test.losses[:-1])
    assert all(torch.equal(v, guide.state_dict()[k]) for k, v in before.items())
    assert math.isfinite(test.lr) and test.lr > 0


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda r: r.update(steps=10**9), "steps=1000000000, where a sweep takes 1 to 60"),
        (
            lambda r: r.update(rates=r["rates"][:-1]),
            "rates, losses or data_losses that are not 16 numbers each",
        ),
        (lambda r: r.update(lr=-1.0), "a rate that is not a positive finite number"),
        (lambda r: r.update(lr=float("inf")), "a rate that is not a positive finite number"),
        (lambda r: r.update(kept=99), "kept=99, outside 0 to steps=16"),
        (lambda r: r.update(extra=1), r"\[.*'extra'.*\], not the fields"),
        (lambda r: r.clear(), r"\[\], not the fields"),
    ],
    ids=["steps", "length", "negative", "infinite", "kept", "extra", "empty"],
)
def test_a_re_signed_rate_record_is_refused_on_resume(tmp_path, change, phrase):
    """The record a resumed fit takes its rate and its remaining steps from is checked as
    every other option is: a forged one (re-signed) is refused before a step."""
    path = tmp_path / "fit.ckpt"
    fit(num_steps=96, run={"checkpoint": path, "checkpoint_every": 10,
                           "callbacks": [lambda view: view.step >= 30]})  # fmt: skip
    payload = torch.load(path, weights_only=True)
    assert payload["options"]["lr_test"]["steps"] == 16
    change(payload["options"]["lr_test"])
    files.atomic_save(payload, path)
    with pytest.raises(ValueError, match=rf"options\['lr_test'\] holds {phrase}"):
        fit(num_steps=96, run={"resume": path})


def test_a_re_signed_checkpoint_without_its_rate_record_is_refused(tmp_path):
    path = tmp_path / "fit.ckpt"
    fit(num_steps=96, run={"checkpoint": path, "checkpoint_every": 10,
                           "callbacks": [lambda view: view.step >= 30]})  # fmt: skip
    payload = torch.load(path, weights_only=True)
    del payload["options"]["lr_test"]
    files.atomic_save(payload, path)
    with pytest.raises(ValueError, match=r"options\['lr_test'\] is missing, where lr_rule="):
        fit(num_steps=96, run={"resume": path})


@pytest.mark.parametrize("per_example", [False, True])
def test_the_sweeps_data_term_weighs_a_steps_minibatches_as_its_loss_does(per_example):
    """A step of two minibatches (``accumulate=2``), per example or not: the data term the
    sweep reads from the loss's own evaluation is the step's loss less its KL part, each
    minibatch's KL evaluated separately on its draw."""
    from zoo.training.rules import StepPlan
    from zoo.training.step import Stepper, shares

    m, guide, objective, batches, generator = resnet_problem()
    opt = optimizer_at(1e-3, objective, zoo.Optim())
    stream = batches.epoch(0)
    inputs = [next(stream), next(stream)]
    start = files.torch_rng_state()
    expected = 0.0
    for (x, y), share in zip(inputs, shares(inputs)):
        before = files.torch_rng_state()
        loss = float(objective.loss(x, y, len(batches)).detach())
        after = files.torch_rng_state()
        files.set_torch_rng_state(before)
        expected += share * (loss - float(objective.kl(x, y)))
        files.set_torch_rng_state(after)
    files.set_torch_rng_state(start)
    plan = StepPlan(check_every=1, cuda_graph=False, accumulate=2, threads=None)
    stepper = Stepper.build(objective, opt, num_data=len(batches), on_divergence="skip",
                            plan=plan, clip_grad_norm=None, per_example=per_example,
                            ranks=Ranks())  # fmt: skip
    terms = rate._DataTerms(objective, len(batches), per_example)
    stepper.body(inputs, terms.loss_of)
    assert terms.taken() == pytest.approx(expected, rel=1e-5)
    assert terms.leaves == []  # read once
