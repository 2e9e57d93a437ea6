"""Online metrics (zoo.models.summaries): accumulated over blocks of sampled networks, they
equal the likelihood's metrics of the whole prediction, whatever the blocks."""

import pytest
import torch

from zoo.models.likelihoods import Categorical, Gaussian, HeteroscedasticGaussian, Likelihood
from zoo.models.predictions import ClassificationPrediction, RegressionPrediction
from zoo.models.summaries import ClassificationSummary, RegressionSummary


def blocks_of(likelihood, outputs, params, sizes):
    """Predictions of consecutive blocks of ``outputs`` (``(S, N, ...)``)."""
    parts, start = [], 0
    for size in sizes:
        block = {k: v[start : start + size] for k, v in params.items()}
        parts.append(likelihood.predict(outputs[start : start + size], block))
        start += size
    return parts


@pytest.mark.parametrize("sizes", [[23], [1] * 23, [10, 10, 3], [7, 16]])
def test_classification_online_equals_whole(sizes):
    g = torch.Generator().manual_seed(0)
    outputs = 3 * torch.randn(23, 50, 4, generator=g)
    y = torch.randint(0, 4, (50,), generator=g)
    lik = Categorical()
    summary = lik.summary(y)
    assert isinstance(summary, ClassificationSummary)
    for part in blocks_of(lik, outputs, {}, sizes):
        summary.add(part)
    whole = lik.metrics(lik.predict(outputs, {}), y)
    got = summary.metrics()
    for name in whole:
        assert got[name] == pytest.approx(whole[name], abs=1e-6), name
    torch.testing.assert_close(summary.probs, lik.predict(outputs, {}).probs)


@pytest.mark.parametrize("likelihood", [Gaussian(), Gaussian(0.3), HeteroscedasticGaussian()])
@pytest.mark.parametrize("sizes", [[19], [5, 5, 5, 4], [1] * 19])
def test_regression_online_equals_whole(likelihood, sizes):
    g = torch.Generator().manual_seed(1)
    width = 2 if isinstance(likelihood, HeteroscedasticGaussian) else 1
    outputs = torch.randn(19, 30, width, generator=g)
    params = (
        {"noise": 0.2 + torch.rand(19, generator=g)}
        if getattr(likelihood, "learned", False)
        else {}
    )
    y = torch.randn(30, generator=g)
    summary = likelihood.summary(y)
    assert isinstance(summary, RegressionSummary)
    for part in blocks_of(likelihood, outputs, params, sizes):
        summary.add(part)
    whole_pred = likelihood.predict(outputs, params)
    whole = likelihood.metrics(whole_pred, y)
    got = summary.metrics()
    for name in whole:
        assert got[name] == pytest.approx(whole[name], rel=1e-5, abs=1e-6), name
    torch.testing.assert_close(summary.mean, whole_pred.mean.reshape(summary.mean.shape))
    torch.testing.assert_close(summary.variance, whole_pred.variance.reshape(summary.mean.shape))


@pytest.mark.parametrize("sizes", [[40], [1] * 40, [3, 17, 20], [39, 1]])
def test_regression_variance_is_exact_at_means_far_from_zero(sizes):
    """Means of 1e9 +- 20 (timestamps, say): the variance merged over blocks is a float64
    two-pass variance of the whole array to 1e-8 (the means' own rounding at 1e9 is 1e-16 of
    them), and the 95% interval covers what it should; ``E[mu^2] - E[mu]^2`` was off by up to
    84% here."""
    g = torch.Generator().manual_seed(4)
    means = 1e9 + 20 * torch.randn(40, 25, generator=g, dtype=torch.float64)
    scales = torch.full((40, 25), 0.5, dtype=torch.float64)
    y = 1e9 + 20 * torch.randn(25, generator=g, dtype=torch.float64)
    summary = RegressionSummary(y)
    start = 0
    for size in sizes:
        block = slice(start, start + size)
        summary.add(
            RegressionPrediction(
                means[block].unsqueeze(-1), sample_means=means[block], sample_scales=scales[block]
            )
        )
        start += size
    centred = means - means.mean(0)  # exact to rounding: the spread is far above 1e9's ulp
    exact = centred.pow(2).mean(0) + 0.25
    assert summary.variance.dtype == torch.float64
    torch.testing.assert_close(summary.variance, exact, rtol=1e-8, atol=0)
    torch.testing.assert_close(summary.mean, means.mean(0), rtol=1e-15, atol=1e-6)
    lower, upper = summary.interval(0.95)
    inside = ((y >= lower) & (y <= upper)).double().mean().item()
    assert summary.metrics()["coverage_95"] == inside < 1.0


def test_a_likelihood_without_sums_scores_the_kept_blocks():
    class Own(Categorical):  # a user's likelihood: only metrics, no summary of its own
        def summary(self, y):
            return Likelihood.summary(self, y)

    g = torch.Generator().manual_seed(2)
    outputs, y = torch.randn(6, 9, 3, generator=g), torch.randint(0, 3, (9,), generator=g)
    own = Own()
    summary = own.summary(y)
    for part in blocks_of(own, outputs, {}, [2, 4]):
        summary.add(part)
    assert summary.metrics() == pytest.approx(own.metrics(own.predict(outputs, {}), y))


def test_summaries_refuse_an_empty_read_and_a_foreign_prediction():
    y = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="no sampled network"):
        ClassificationSummary(y).metrics()
    regression = RegressionPrediction(
        torch.zeros(2, 3, 1), sample_means=torch.zeros(2, 3), sample_scales=torch.ones(2, 3)
    )
    with pytest.raises(TypeError, match="adds ClassificationPredictions"):
        ClassificationSummary(y).add(regression)
    classification = ClassificationPrediction(torch.zeros(2, 3, 2),
                                              sample_probs=torch.full((2, 3, 2), 0.5))  # fmt: skip
    with pytest.raises(TypeError, match="adds RegressionPredictions"):
        RegressionSummary(torch.zeros(3)).add(classification)


def test_the_condensed_prediction_has_the_whole_distances_to_a_reference():
    from zoo.evaluation.agreement import distances

    g = torch.Generator().manual_seed(3)
    for lik, width, params in (
        (Categorical(), 4, {}),
        (Gaussian(), 1, {"noise": 0.2 + torch.rand(12, generator=g)}),
        (HeteroscedasticGaussian(), 2, {}),
    ):
        outputs = torch.randn(12, 15, width, generator=g)
        ref_params = {k: torch.cat([v, v, v[:6]]) for k, v in params.items()}
        reference = lik.predict(torch.randn(30, 15, width, generator=g), ref_params)
        y = torch.randint(0, 4, (15,), generator=g) if width == 4 else torch.randn(15, generator=g)
        summary = lik.summary(y)
        for part in blocks_of(lik, outputs, params, [5, 7]):
            summary.add(part)
        whole = distances(lik.predict(outputs, params), reference)
        assert distances(summary.condensed(), reference) == pytest.approx(whole, rel=1e-5)
