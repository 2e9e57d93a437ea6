"""Predictions in blocks of bounded memory (zoo.results.blocks): every kind of posterior goes
through its draws block by block, and what it returns equals the whole-array computation on
the same draws: predict equals predict_draws of sample's draws, evaluate equals the metrics of
the whole prediction. The block budget is shrunk so that the small test nets need many."""

import math

import pytest
import torch

import zoo
from tests.zoo.results.test_posterior import QUIET, classification, classifier, make
from zoo.models.likelihoods import Categorical, Gaussian
from zoo.results import blocks
from zoo.results.loading import READERS
from zoo.runtime.rng import seeded

pytest.importorskip("laplace")


@pytest.fixture
def tiny_blocks(monkeypatch):
    """A budget of three draws of the test classifier (float32) per block."""
    weights = sum(math.prod(s) for s in classifier().site_shapes.values())
    monkeypatch.setattr(blocks, "DRAW_MEMORY", 3 * weights * 4)


@pytest.fixture(scope="module", params=sorted(READERS))
def posterior(request):
    return make(request.param)


def test_block_arithmetic():
    assert blocks.draws_per_block(100, budget=1000) == 10
    assert blocks.draws_per_block(10_000, budget=1000) == 1  # a draw over budget: one a block
    assert blocks.block_sizes(10, 4) == [4, 4, 2]
    assert blocks.block_sizes(8, 4) == [4, 4]
    assert blocks.block_seed(7, 0) == 7 and blocks.block_seed(None, 3) is None
    seeds = {blocks.block_seed(7, j) for j in range(100)}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert blocks.draw_bytes({"a": (3, 4), "b": (5,)}) == 17 * 4


def test_predict_and_evaluate_stream_and_equal_the_whole_array(posterior, tiny_blocks):
    x, y = classification(20, seed=1)
    counted = list(
        posterior.prediction_blocks(
            x, posterior.predict_options(10, None, 4, False, None, False, None)
        )
    )
    # every kind that draws weights goes through them in several blocks (probit: one sample)
    assert len(counted) > 1 or posterior.kind == "laplace"
    pred = posterior.predict(x, num_samples=10, seed=4, progress=False)
    assert pred.num_samples == sum(p.num_samples for p in counted)
    torch.testing.assert_close(pred.outputs, torch.cat([p.outputs for p in counted]))
    if posterior.kind in ("fit", "reference", "draws"):  # one network per draw of sample()
        whole = posterior.predict_draws(x, posterior.sample(10, seed=4))
        torch.testing.assert_close(pred.outputs, whole.outputs)
    metrics = posterior.evaluate((x, y), num_samples=10, seed=4, progress=False)
    expected = posterior.model.likelihood.metrics(pred, y)
    assert metrics.keys() == expected.keys()
    for name in metrics:
        assert metrics[name] == pytest.approx(expected[name], abs=1e-5), name


def test_a_fit_holds_one_block_of_weights_at_a_time(tiny_blocks, monkeypatch):
    fit = make("fit")
    sizes = []
    original = type(fit.guide).sample_posterior

    def spy(self, num_samples):
        sizes.append(num_samples)
        return original(self, num_samples)

    monkeypatch.setattr(type(fit.guide), "sample_posterior", spy)
    fit.predict(classification(5)[0], num_samples=10, progress=False)
    assert sizes == [3, 3, 3, 1]
    sizes.clear()
    fit.evaluate(classification(5), num_samples=7, progress=False)
    assert sizes == [3, 3, 1]


def test_draws_in_one_block_are_todays_seeded_stream():
    """Within the budget the draws are one sample_posterior call under the seed."""
    fit = make("fit")
    draws = fit.sample(50, seed=11)
    with seeded(11):
        expected = fit.guide.sample_posterior(50)
    for name in expected:
        assert torch.equal(draws[name], expected[name])


def test_seeded_blocks_do_not_depend_on_how_they_are_consumed(tiny_blocks):
    fit = make("fit")
    first = fit.sample(10, seed=2)
    again = fit.sample(10, seed=2)
    for name in first:
        assert torch.equal(first[name], again[name])
    other = fit.sample(10, seed=3)
    name = max(first, key=lambda n: first[n][0].numel())  # the largest weight
    assert not torch.equal(first[name], other[name])
    # block j is not block 0 again: the blocks are not copies of each other
    w = first[name]
    assert not torch.equal(w[:3], w[3:6])


def test_an_unseeded_prediction_advances_the_global_stream(tiny_blocks):
    fit = make("fit")
    x = classification(4)[0]
    torch.manual_seed(0)
    a = fit.predict(x, num_samples=7, seed=None, progress=False).outputs
    b = fit.predict(x, num_samples=7, seed=None, progress=False).outputs
    assert not torch.equal(a, b)
    torch.manual_seed(0)
    torch.testing.assert_close(fit.predict(x, num_samples=7, seed=None, progress=False).outputs, a)


def test_stored_draws_select_evenly_spaced_draws_block_by_block(tiny_blocks):
    fit = make("fit")
    draws = zoo.from_draws(fit.model, fit.sample(20, seed=3))
    selected = draws.sample(7)
    parts = list(draws.draw_blocks(7, 0))
    assert [next(iter(p.values())).shape[0] for p in parts] == [3, 3, 1]
    for name in selected:
        torch.testing.assert_close(torch.cat([p[name] for p in parts]), selected[name])


def test_a_laplace_nn_predictive_draws_its_weights_in_blocks(monkeypatch):
    data = classification()
    fit = zoo.laplace(classifier(), data, num_steps=30, progress=False,
                      options={"predictive": "nn"})  # fmt: skip
    monkeypatch.setattr(blocks, "DRAW_MEMORY", 4 * 4 * int(fit.laplace.n_params))
    options = fit.predict_options(10, None, 0, False, None, False, None)
    parts = list(fit.prediction_blocks(data[0], options))
    assert [p.num_samples for p in parts] == [4, 4, 2]
    metrics = fit.evaluate(data, num_samples=10, progress=False)
    whole = fit.model.likelihood.metrics(fit.predict(data[0], num_samples=10, progress=False),
                                         data[1])  # fmt: skip
    for name in metrics:
        assert metrics[name] == pytest.approx(whole[name], abs=1e-5)


def test_regression_evaluate_streams_exactly(tiny_blocks):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(40, generator=g)
    model = zoo.models.BayesianMLP(2, (4,), 1, task="regression")
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=20, run=QUIET)
    per = blocks.draws_per_block(sum(math.prod(s) for s in model.site_shapes.values()) * 4)
    assert per < 9  # several blocks of 17 draws
    metrics = fit.evaluate((x, y), num_samples=17, progress=False)
    whole = Gaussian.metrics(fit.model.likelihood, fit.predict(x, num_samples=17,
                                                                 progress=False), y)  # fmt: skip
    for name in metrics:
        assert metrics[name] == pytest.approx(whole[name], rel=1e-5, abs=1e-6), name
    assert isinstance(fit.model.likelihood, Gaussian)
    assert not isinstance(fit.model.likelihood, Categorical)
