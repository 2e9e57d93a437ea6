"""Distances to a reference predictive (zoo.evaluation.agreement), each on a case with a known
answer, and zoo.compare's reference columns."""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from tests.zoo.linear_gaussian import correlated_data, model_for
from zoo.comparison import ReferenceNotConvergedWarning
from zoo.evaluation import agreement
from zoo.models.likelihoods import Categorical


def _classes(probs) -> zoo.ClassificationPrediction:
    """A prediction whose draws have the class probabilities ``probs`` ``(S, N, C)``."""
    probs = torch.as_tensor(probs, dtype=torch.float64)
    return Categorical().predict(probs.log(), {})


def _gaussians(means, scales) -> zoo.RegressionPrediction:
    """A prediction whose draws are ``N(means, scales^2)``, each ``(S, N)``."""
    means = torch.as_tensor(means, dtype=torch.float64)
    scales = torch.as_tensor(scales, dtype=torch.float64)
    return zoo.RegressionPrediction(means, sample_means=means, sample_scales=scales)


def test_a_predictive_against_itself_is_at_distance_zero():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(5, 30, 4, dtype=torch.float64), -1)
    c = _classes(probs)
    assert agreement.agreement(c, c) == 1 and agreement.total_variation(c, c) == 0
    r = _gaussians(torch.randn(5, 30), torch.rand(5, 30) + 0.5)
    d = agreement.distances(r, r)
    assert d["w2"] == 0 and d["sd_ratio"] == pytest.approx(1, abs=1e-12)


def test_classification_distances_have_their_closed_forms():
    # Input 0: p = (0.9, 0.1) vs q = (0.2, 0.8): TV 0.7, the classes differ.
    # Input 1: p = (0.6, 0.4) vs q = mean of (0.5, 0.5) and (0.9, 0.1) = (0.7, 0.3): TV 0.1,
    # both predict class 0.
    p = _classes([[[0.9, 0.1], [0.6, 0.4]]])
    q = _classes([[[0.2, 0.8], [0.5, 0.5]], [[0.2, 0.8], [0.9, 0.1]]])
    assert agreement.agreement(p, q) == 0.5
    assert agreement.total_variation(p, q) == pytest.approx((0.7 + 0.1) / 2)


def test_w2_of_two_gaussians_is_the_closed_form_and_sd_ratio_the_geometric_mean():
    p = _gaussians([[0.0, 1.0]], [[1.0, 2.0]])
    q = _gaussians([[3.0, 1.0]], [[5.0, 0.5]])
    expected = (math.sqrt(3**2 + 4**2) + math.sqrt(0 + 1.5**2)) / 2
    assert agreement.w2(p, q) == pytest.approx(expected)
    assert agreement.sd_ratio(p, q) == pytest.approx(math.sqrt((1 / 5) * (2 / 0.5)))
    # A mixture's moments: draws N(-1, 1) and N(1, 1) have mean 0 and variance 2.
    mix = _gaussians([[-1.0], [1.0]], [[1.0], [1.0]])
    one = _gaussians([[0.0]], [[math.sqrt(2)]])
    assert agreement.w2(mix, one) == pytest.approx(0, abs=1e-12)


def test_reference_coverage_is_the_reference_mass_of_the_interval():
    r = _gaussians([[0.0, 2.0]], [[1.0, 0.5]])  # one draw: the 95% interval holds 95%
    assert agreement.reference_coverage(r, r) == pytest.approx(0.95, abs=1e-9)
    wide = _gaussians([[0.0]], [[2.0]])
    narrow = _gaussians([[0.0]], [[1.0]])  # +-1.96 * 2 under N(0, 1): P(|z| < 3.92)
    assert agreement.reference_coverage(wide, narrow) == pytest.approx(
        math.erf(3.919928 / math.sqrt(2)), abs=1e-6
    )
    # Monte Carlo check on a two-draw reference mixture.
    ref = _gaussians([[-1.0], [1.5]], [[0.7], [1.2]])
    lo, hi = narrow.interval(0.95)
    g = torch.Generator().manual_seed(0)
    which = torch.randint(2, (400_000,), generator=g)
    y = ref.sample_means[which, 0] + ref.sample_scales[which, 0] * torch.randn(
        400_000, generator=g, dtype=torch.float64
    )
    mc = ((y >= lo) & (y <= hi)).double().mean().item()
    assert agreement.reference_coverage(narrow, ref) == pytest.approx(mc, abs=3e-3)


def test_mismatched_predictions_are_refused():
    c, r = _classes([[[0.5, 0.5]]]), _gaussians([[0.0, 1.0]], [[1.0, 1.0]])
    with pytest.raises(TypeError, match="ClassificationPrediction"):
        agreement.agreement(c, r)
    with pytest.raises(ValueError, match="1 inputs and the reference 2"):
        agreement.w2(_gaussians([[0.0]], [[1.0]]), r)


def test_compare_adds_the_distances_and_the_reference_row():
    x, y = correlated_data(n=120, d=2)
    xt, yt = correlated_data(n=40, d=2, seed=1)
    ref = zoo.reference(model_for(2), (x, y), chains=2, warmup=60, draws=40, progress=False)
    # 2 chains of 40 draws: too short for the reference's own diagnostics, which compare says
    with pytest.warns(ReferenceNotConvergedWarning, match="output R-hat"):
        table = zoo.compare(
            lambda: model_for(2),
            ["diagonal", "map"],
            (x, y),
            (xt, yt),
            reference=ref,
            num_samples=20,
            num_steps=300,
            lr=0.05,
            progress=False,
        )
    assert list(table.index) == ["diagonal", "map", "HMC reference"]
    assert table.loc["HMC reference", "w2"] == 0
    assert table.loc["HMC reference", "fit_seconds"] == ref.wall_time
    # A point mass has no epistemic spread: narrower than the reference, never wider.
    assert table.loc["map", "sd_ratio"] < 1
    assert table.loc["diagonal", "w2"] < 0.2 and 0.85 < table.loc["diagonal", "sd_ratio"] < 1.15
    metrics = ref.evaluate((xt, yt), progress=False)
    assert table.loc["HMC reference", "rmse"] == pytest.approx(metrics["rmse"])


def test_compare_refuses_a_reference_of_another_model():
    x, y = correlated_data(n=60, d=2)
    ref = zoo.reference(model_for(2), (x, y), chains=1, warmup=10, draws=4, progress=False)
    with pytest.raises(ValueError, match="the reference is of another model than the other rows"):
        zoo.compare(lambda: model_for(3), ["map"], (x, y), (x, y), reference=ref, progress=False)
