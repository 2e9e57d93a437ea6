import math

import pytest
import torch

from zoo import metrics


def test_hand_computed_values():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 1])
    assert metrics.accuracy(probs, labels) == pytest.approx(2 / 3)
    assert metrics.nll(probs, labels) == pytest.approx(
        -(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3
    )
    brier = ((0.1**2 + 0.1**2) + (0.2**2 + 0.2**2) + (0.6**2 + 0.6**2)) / 3
    assert metrics.brier(probs, labels) == pytest.approx(brier)


def test_ece_of_a_calibrated_toy_is_zero():
    # confidence 0.75 in every case, right in 3 of 4
    probs = torch.tensor([[0.75, 0.25]] * 4)
    labels = torch.tensor([0, 0, 0, 1])
    assert metrics.ece(probs, labels) == pytest.approx(0.0, abs=1e-6)


def test_ece_of_an_overconfident_toy():
    # confidence 0.95, accuracy 0.5: ECE = |0.5 - 0.95| = 0.45
    probs = torch.tensor([[0.95, 0.05]] * 10)
    labels = torch.tensor([0] * 5 + [1] * 5)
    assert metrics.ece(probs, labels) == pytest.approx(0.45, abs=1e-6)
    # two bins: half at 0.95 (all right), half at 0.6 (all wrong): (0.05 + 0.6) / 2
    probs = torch.tensor([[0.95, 0.05]] * 5 + [[0.6, 0.4]] * 5)
    labels = torch.tensor([0] * 5 + [1] * 5)
    assert metrics.ece(probs, labels) == pytest.approx((0.05 + 0.6) / 2, abs=1e-6)
    rel = metrics.reliability(probs, labels)
    assert rel["count"].sum() == 10


def test_auroc():
    assert metrics.ood_auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.8, 0.9])) == 1.0
    assert metrics.ood_auroc(torch.tensor([0.9, 0.8]), torch.tensor([0.1, 0.2])) == 0.0


def test_regression_metrics():
    mean, target = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])
    assert metrics.rmse(mean, target) == pytest.approx(math.sqrt(0.5))
    var = torch.tensor([1.0, 4.0])
    expected = 0.5 * (math.log(2 * math.pi) + 1.0) + 0.5 * math.log(2 * math.pi * 4.0)
    assert metrics.gaussian_nll(mean, var, target) == pytest.approx(expected / 2)
    # a mixture of identical components is that component
    means = torch.zeros(5, 2)
    scales = torch.ones(5, 2)
    single = metrics.gaussian_nll(torch.zeros(2), torch.ones(2), target)
    assert metrics.gaussian_mixture_nll(means, scales, target) == pytest.approx(single)
    assert (
        metrics.interval_coverage(torch.tensor([0.0, 2.0]), torch.tensor([2.0, 3.0]), target) == 0.5
    )


def test_certainty_table_matches_a_direct_computation():
    torch.manual_seed(0)
    logits = torch.randn(1, 300, 4) * 3 + 0.8 * torch.randn(50, 300, 4)
    sample_probs = logits.softmax(-1)
    labels = torch.randint(0, 4, (300,))
    table = metrics.certainty_table(sample_probs, labels)
    assert sum(table.values()) == 300
    # direct, per example
    counts = dict.fromkeys(table, 0)
    for n in range(300):
        p = sample_probs[:, n]
        lo = torch.quantile(p, 0.025, dim=0)
        hi = torch.quantile(p, 0.975, dim=0)
        pred = int(p.mean(0).argmax())
        certain = all(lo[pred] > hi[c] for c in range(4) if c != pred)
        key = ("certain_" if certain else "uncertain_") + (
            "correct" if pred == labels[n] else "wrong"
        )
        counts[key] += 1
    assert counts == table
    assert table["certain_correct"] > 0 and table["uncertain_wrong"] > 0
