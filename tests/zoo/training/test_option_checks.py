"""The option groups' checks (zoo.training.option_checks): a value that cannot be right is refused
when the group is built or, for a schedule, before the first step."""

import math

import pytest
import torch

import zoo
from zoo.models import BayesianMLP


def data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0]


def fit(**groups):
    return zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", data(), num_steps=4,
                   run=zoo.Run(progress=False), **groups)  # fmt: skip


@pytest.mark.parametrize(
    "schedule, shown",
    [(lambda i: -1.0, "-1.0"), (lambda i: math.nan, "nan"), (lambda i: "x", "'x'"),
     (lambda i: 1.0 if i < 3 else -0.5, "-0.5 at step 3")],
    ids=["negative", "nan", "string", "negative-at-the-end"],
)  # fmt: skip
def test_a_learning_rate_schedule_that_is_not_a_finite_factor_is_refused(schedule, shown):
    with pytest.raises(ValueError, match=f"lr_schedule gave {shown}"):
        fit(optim=zoo.Optim(lr_schedule=schedule))


@pytest.mark.parametrize(
    "schedule, shown",
    [(lambda i: -1.0 if 3 <= i <= 8 else 1.0, "-1.0 at step 3"),
     (lambda i: None if i == 5 else 1.0, "None at step 5")],
    ids=["negative-mid-run", "none-mid-run"],
)  # fmt: skip
def test_every_steps_factor_is_checked_and_the_fit_stops_before_taking_a_bad_one(schedule, shown):
    steps = []
    with pytest.raises(ValueError, match=f"lr_schedule gave {shown}.*stopped before taking it"):
        zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", data(), num_steps=12, batch_size=40,
                optim=zoo.Optim(lr_schedule=schedule),
                run=zoo.Run(progress=False, callbacks=[lambda view: steps.append(1)]))  # fmt: skip
    assert len(steps) <= int(shown.split()[-1])  # no step ran at the bad factor


@pytest.mark.parametrize("schedule", [["cosine"], {"name": "cosine"}, 3])
def test_a_schedule_that_is_neither_a_name_nor_a_callable_is_refused(schedule):
    with pytest.raises(ValueError, match="lr_schedule must be a callable step -> factor or one"):
        fit(optim=zoo.Optim(lr_schedule=schedule))


@pytest.mark.parametrize("scale", [math.inf, math.nan, 0, -1])
def test_a_recipe_scale_that_is_not_finite_and_positive_is_refused(scale):
    import guides

    with pytest.raises(ValueError, match="a finite positive number"):
        guides.Recipe(lr_scale=scale)
    with pytest.raises(ValueError, match="a finite positive number"):
        guides.Recipe(full_batch_lr_scale=scale)


def test_a_schedule_that_raises_is_named():
    with pytest.raises(ValueError, match="lr_schedule raised ZeroDivisionError at step 0"):
        fit(optim=zoo.Optim(lr_schedule=lambda i: 1 / i))


def test_a_warm_up_from_zero_is_taken():
    assert fit(optim=zoo.Optim(lr_schedule=lambda i: min(1.0, i / 2))).steps == 4


@pytest.mark.parametrize("factor", [-1.0, math.nan, math.inf, "2"])
def test_a_learning_rate_multiplier_that_is_not_a_finite_factor_is_refused(factor):
    with pytest.raises(ValueError, match="lr_multipliers\\['\\*'\\]"):
        zoo.Optim(lr_multipliers={"*": factor})


def test_lr_in_optimizer_options_is_refused():
    with pytest.raises(ValueError, match="optimizer_options must not hold 'lr': pass lr="):
        zoo.Optim(optimizer_options={"lr": -1})


def test_an_option_the_optimiser_refuses_is_named():
    with pytest.raises(ValueError, match="Adam refused optimizer_options"):
        fit(optim=zoo.Optim(optimizer_options={"betas": (2.0, 0.9)}))


@pytest.mark.parametrize("weight", [lambda i: -1.0, lambda i: math.nan])
def test_a_kl_weight_schedule_that_is_not_a_finite_factor_is_refused(weight):
    with pytest.raises(ValueError, match="kl_weight gave"):
        zoo.Loss(kl_weight=weight)


def test_checkpoint_every_without_a_checkpoint_is_refused():
    with pytest.raises(ValueError, match="checkpoint_every=5 needs checkpoint="):
        zoo.Run(checkpoint_every=5)


@pytest.mark.parametrize("callbacks", [5, print, "f"])
def test_callbacks_that_are_not_a_list_of_callables_are_refused(callbacks):
    with pytest.raises(TypeError, match="callbacks must be a list of callables"):
        zoo.Run(callbacks=callbacks)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "meta"])
def test_a_device_no_fit_can_use_is_refused(device):
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda'"):
        zoo.Engine(device=device)


@pytest.mark.parametrize("devices", [0, -2, "0", [], [-1], True])
def test_a_device_count_no_fit_can_use_is_refused(devices):
    with pytest.raises(ValueError, match="devices must be a count >= 1"):
        zoo.Engine(devices=devices)


@pytest.mark.parametrize("devices", [1, 2, -1, "auto", "2", "0,1", [0, 1]])
def test_lightnings_device_counts_are_taken(devices):
    assert zoo.Engine(devices=devices).devices == devices
