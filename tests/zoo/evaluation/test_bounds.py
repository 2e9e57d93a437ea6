"""A prediction's result bounded before the first draw (zoo.evaluation.bounds): a call whose
outputs could not fit in the device's memory is refused naming the numbers, and nothing is
drawn; a posterior of stored draws asked for more than it holds says so."""

import pytest
import torch

import zoo
from zoo.evaluation import bounds
from zoo.models import BayesianMLP

QUIET = zoo.Run(progress=False)


@pytest.fixture(scope="module")
def fitted():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 3, generator=g), torch.randint(0, 2, (100,), generator=g)
    model = BayesianMLP(3, (8,), 2, task="classification")
    return zoo.fit(model, "diagonal", (x, y), num_steps=2, run=QUIET), x


def test_a_prediction_past_the_memory_is_refused_before_any_draw(fitted, monkeypatch):
    fit, x = fitted

    def no_draw(*args, **kwargs):
        raise AssertionError("a draw was made")

    monkeypatch.setattr(type(fit), "draw_blocks", no_draw)
    with pytest.raises(ValueError, match=r"predict\(num_samples=1,000,000,000\) on 100 inputs "
                       r"would hold at least 1,000,000,000 x 100 x 2 outputs"):  # fmt: skip
        fit.predict(x, num_samples=10**9)
    with pytest.raises(ValueError, match=r"prior_predictive\(num_samples=10,000,000\)"):
        zoo.prior_predictive(fit.model, x, 10**7)


def test_the_bound_is_the_result_s_bytes_against_the_memory(fitted, monkeypatch):
    """Classification holds the logits and the probabilities: 2 x S x N x C float32 numbers;
    the call is refused one byte past the memory and runs at it."""
    fit, x = fitted
    needed = 2 * 7 * 100 * 2 * 4
    assert bounds.prediction_bytes(fit.model, 100, 7, torch.float32) == needed
    monkeypatch.setattr(bounds, "physical_memory", lambda: needed - 1)
    with pytest.raises(ValueError, match="more than this machine's"):
        fit.predict(x, num_samples=7)
    monkeypatch.setattr(bounds, "physical_memory", lambda: needed)
    assert fit.predict(x, num_samples=7).num_samples == 7
    stacked = bounds.prediction_bytes(fit.model, 100, 7, torch.float32, stacked=True)
    assert stacked == 3 * 7 * 100 * 2 * 4 + 7 * bounds.STACKED_PER_NETWORK


def test_stored_draws_asked_for_more_than_they_hold_warn_with_the_numbers(fitted):
    fit, x = fitted
    draws = zoo.from_draws(fit.model, fit.sample(10))
    with pytest.warns(UserWarning, match=r"num_samples=50 asks for more draws than this Draws "
                      r"holds \(10: 1 chain\(s\) of 10\); using all 10"):  # fmt: skip
        assert draws.predict(x, num_samples=50).num_samples == 10
    assert draws.predict(x, num_samples=10).num_samples == 10  # no warning: errors here
