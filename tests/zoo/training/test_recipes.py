"""zoo.training.recipes: what a fit does when the caller gives no length, batch size or rate."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import guides
import zoo
from zoo.training.optim import make_scheduler
from zoo.training.recipes import (
    CONVERGENCE_LR,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    DEFAULT_SCHEDULE,
    MIN_DEFAULT_STEPS,
    REGRESSION_FIT,
    SMALL_DATA,
    ShortFitWarning,
    data_size,
    resolve_length,
)


def regression(n=64, features=1):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    return x, torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)


def test_data_size_of_every_form():
    x, y = regression(10)
    ds = TensorDataset(x, y)
    assert data_size((x, y)) == data_size(ds) == data_size(DataLoader(ds, batch_size=3)) == 10


def test_small_regression_data_gets_the_full_batch_recipe():
    model = zoo.models.BayesianMLP(1, (8,))
    length = resolve_length(
        regression(100),
        model,
        epochs=None,
        num_steps=None,
        batch_size=None,
        lr=None,
        lr_schedule=None,
    )
    assert (length.num_steps, length.batch_size, length.lr, length.lr_schedule) == (
        REGRESSION_FIT["num_steps"],
        100,
        REGRESSION_FIT["lr"],
        REGRESSION_FIT["lr_schedule"],
    )
    # Given values are kept; a given length means no recipe.
    kept = resolve_length(
        regression(100),
        model,
        epochs=None,
        num_steps=None,
        batch_size=10,
        lr=0.5,
        lr_schedule="cosine",
    )
    assert (kept.num_steps, kept.batch_size, kept.lr, kept.lr_schedule) == (3000, 10, 0.5, "cosine")
    given = resolve_length(
        regression(100),
        model,
        epochs=2,
        num_steps=None,
        batch_size=None,
        lr=None,
        lr_schedule=None,
    )
    assert (given.epochs, given.num_steps, given.batch_size, given.lr, given.recipe) == (
        2,
        None,
        DEFAULT_BATCH_SIZE,
        REGRESSION_FIT["lr"],  # a given length keeps the recipe's rate, not its length
        "given",
    )


def test_classification_and_large_data_keep_one_epoch():
    classifier = zoo.models.BayesianMLP(1, (8,), 3, task="classification")
    x, _ = regression(100)
    length = resolve_length(
        (x, torch.zeros(100, dtype=torch.long)),
        classifier,
        epochs=None,
        num_steps=None,
        batch_size=None,
        lr=None,
        lr_schedule=None,
    )
    assert (length.epochs, length.num_steps, length.recipe) == (1, None, "default")
    large = resolve_length(
        regression(SMALL_DATA + 1),
        zoo.models.BayesianMLP(1, (8,)),
        epochs=None,
        num_steps=None,
        batch_size=None,
        lr=None,
        lr_schedule=None,
    )
    assert large.recipe == "default" and large.batch_size == DEFAULT_BATCH_SIZE


def test_the_minibatch_rate_decays_unless_a_rate_is_given():
    """No ``lr``: 1e-2 decaying tenfold over the run (a given schedule kept); a given ``lr``
    runs constant; a convergence rule's length runs at the constant 1e-3 it can settle at."""
    classifier = zoo.models.BayesianMLP(1, (8,), 3, task="classification")
    x, _ = regression(3000)
    data = (x, torch.zeros(3000, dtype=torch.long))

    def resolved(**given):
        options = {"epochs": None, "num_steps": None, "batch_size": None, "lr": None,
                   "lr_schedule": None, **given}  # fmt: skip
        length = resolve_length(data, classifier, **options)
        return length.lr, length.lr_schedule

    assert (DEFAULT_LR, DEFAULT_SCHEDULE, CONVERGENCE_LR) == (3e-3, "exponential", 1e-3)
    assert resolved() == (DEFAULT_LR, DEFAULT_SCHEDULE)
    assert resolved(num_steps=50) == (DEFAULT_LR, DEFAULT_SCHEDULE)
    assert resolved(lr=3e-4) == (3e-4, None)
    assert resolved(lr=3e-4, lr_schedule="cosine") == (3e-4, "cosine")
    assert resolved(lr_schedule="cosine") == (DEFAULT_LR, "cosine")
    assert resolved(num_steps=500, auto=True) == (CONVERGENCE_LR, None)
    scaled = resolve_length(data, classifier, epochs=None, num_steps=None, batch_size=None,
                            lr=None, lr_schedule=None,
                            recipe=guides.Recipe(lr_scale=0.3))  # fmt: skip
    assert scaled.lr == 0.3 * DEFAULT_LR


def test_a_default_minibatch_fit_ends_at_a_tenth_of_its_rate():
    x, _ = regression(SMALL_DATA + 1)
    y = (x[:, 0] > 0).long()
    fit = zoo.fit(
        zoo.models.BayesianMLP(1, (8,), 2, task="classification"),
        "diagonal",
        (x, y),
        epochs=2,
        run=zoo.Run(progress=False),
    )
    assert fit.options["lr"] == DEFAULT_LR and fit.options["lr_schedule"] == DEFAULT_SCHEDULE
    total = fit.options["num_steps"]
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=DEFAULT_LR)
    schedule = make_scheduler(optimizer, DEFAULT_SCHEDULE, total)
    for _ in range(total):
        optimizer.step()
        schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(DEFAULT_LR / 10)


def full_batch_fit(x, y, **options):
    """A fit of small regression data given no length: the full-batch recipe."""
    model = zoo.models.BayesianMLP(1, (16,), noise=0.1)
    return zoo.fit(model, "diagonal", (x, y), run=zoo.Run(progress=False), **options)


@pytest.mark.slow  # the recipe's 3,000 full-batch steps: the full tier
def test_a_full_batch_regression_fit_with_no_options_is_fitted():
    """The issue's case: a full-batch fit once ran one step at lr 1e-3 and learned nothing."""
    x, y = regression(160)
    fit = full_batch_fit(x, y)
    assert fit.steps == REGRESSION_FIT["num_steps"]  # the recipe's rate: no rate test
    assert fit.options["recipe"] == "small regression data" and "lr_test" not in fit.options
    assert fit.options["lr_rule"] == "default (small regression data's recipe)"
    assert fit.options["batch_size"] == 160 and fit.options["lr"] == REGRESSION_FIT["lr"]
    rmse = fit.evaluate((x, y), num_samples=50, progress=False)["rmse"]
    assert rmse < 0.5 * y.std().item()  # fitted, where predicting the mean gives y's sd


def test_a_short_default_fit_warns_and_says_what_to_pass():
    n = SMALL_DATA + 1  # one epoch at batch 128: 17 steps
    x, y = regression(n)
    model = zoo.models.BayesianMLP(1, (4,), noise=0.1)
    with pytest.warns(ShortFitWarning, match="num_steps=") as record:
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            run=zoo.Run(progress=False),
        )
    assert f"{-(-n // 128)} optimiser step" in str(record[0].message)
    with warnings.catch_warnings():  # a length the caller chose is theirs: no warning
        warnings.simplefilter("error", ShortFitWarning)
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            epochs=1,
            run=zoo.Run(progress=False),
        )
    assert MIN_DEFAULT_STEPS > -(-n // 128)


def test_a_fit_from_trained_weights_runs_at_the_trained_factor_of_the_default_rate():
    from torch import nn

    from zoo.training.recipes import TRAINED_LR_FACTOR, starts_trained

    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    trained, fresh = (
        zoo.models.from_module(net, init="module"),
        zoo.models.from_module(net, init="fresh"),
    )
    assert starts_trained(trained, "diagonal") and starts_trained(trained, guides.AutoLowRank)
    assert not starts_trained(trained, "whvi")  # starts from its own draw
    assert not starts_trained(fresh, "diagonal")
    assert not starts_trained(trained, guides.family("diagonal", init_loc_fn="kaiming"))
    assert starts_trained(fresh, guides.family("diagonal", init_module=net))
    assert starts_trained(trained, guides.AutoDiagonal(trained))
    assert not starts_trained(trained, lambda model: guides.AutoDiagonal(model))  # unknown
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    quiet = zoo.Run(progress=False)
    fit = zoo.fit(trained, "diagonal", (x, y), num_steps=2, run=quiet)
    assert fit.options["lr"] == pytest.approx(DEFAULT_LR * TRAINED_LR_FACTOR)
    assert fit.options["recipe"].endswith("trained start")
    given = zoo.fit(trained, "diagonal", (x, y), num_steps=2, lr=0.05, run=quiet)
    assert given.options["lr"] == 0.05 and "trained" not in given.options["recipe"]
    regression = zoo.models.from_module(nn.Linear(4, 1), task="regression", init="module")
    small = zoo.fit(regression, "diagonal", (x, x.sum(1)), run=quiet)
    assert small.options["lr"] == pytest.approx(REGRESSION_FIT["lr"] * TRAINED_LR_FACTOR)


def test_small_regression_data_keep_the_recipes_rate_at_a_given_length():
    """A given length replaces the recipe's length, not its rate: the range test's faster rates
    over-fit a point estimate on small regression data at any length (``benchmarks/README.md``,
    diabetes at ten times the budget). Full batch or not picks the family's scale; a
    classifier of as few examples, and ``lr="auto"``, still measure."""
    x, y = regression(160)
    model = zoo.models.BayesianMLP(1, (8,), noise=0.1)
    recipe = guides.Recipe(lr_scale=3.0, full_batch_lr_scale=0.5)

    def resolved(data=(x, y), net=model, **given):
        options = {"epochs": None, "num_steps": 600, "batch_size": None, "lr": None,
                   "lr_schedule": None, "recipe": recipe, **given}  # fmt: skip
        return resolve_length(data, net, **options)

    full = resolved(batch_size=160)
    assert full.lr == pytest.approx(REGRESSION_FIT["lr"] * 0.5) and full.measure is None
    assert full.lr_schedule == REGRESSION_FIT["lr_schedule"] and full.recipe == "given"
    assert full.lr_rule == "default (small regression data's recipe)" and full.num_steps == 600
    minibatch = resolved(num_steps=None, epochs=40)  # batch 128 of 160: the minibatch scale
    assert minibatch.lr == pytest.approx(REGRESSION_FIT["lr"] * 3.0)
    assert minibatch.batch_size == DEFAULT_BATCH_SIZE and minibatch.epochs == 40
    assert resolved(lr_schedule="cosine").lr_schedule == "cosine"
    assert resolved(lr="auto").measure == "required"
    classifier = zoo.models.BayesianMLP(1, (8,), 2, task="classification")
    measured = resolved((x, (y > 0).long()), classifier)
    assert measured.measure == "default" and measured.lr == pytest.approx(DEFAULT_LR * 3.0)
    fit = zoo.fit(model, "map", (x, y), num_steps=80, run=zoo.Run(progress=False))
    assert "lr_test" not in fit.options and fit.steps == 80
    assert fit.options["lr_rule"] == "default (small regression data's recipe)"


def test_the_full_batch_recipe_measures_its_rate_when_asked():
    fit = full_batch_fit(*regression(160), lr="auto")
    test = fit.options["lr_test"]
    assert fit.steps + test["steps"] == REGRESSION_FIT["num_steps"]
    assert test["base"] == REGRESSION_FIT["lr"] and fit.options["lr"] == test["lr"]
    assert fit.options["recipe"] == "small regression data, rate measured"
