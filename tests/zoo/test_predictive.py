import torch

from zoo.predictive import Prediction


def test_mutual_information_is_zero_when_samples_agree_and_positive_otherwise():
    same = torch.tensor([[0.7, 0.2, 0.1]]).expand(5, 1, 3)
    pred = Prediction("classification", same.log(), sample_probs=same)
    assert torch.allclose(pred.mutual_information, torch.zeros(1), atol=1e-6)
    assert torch.allclose(pred.entropy, pred.expected_entropy)
    differ = torch.tensor([[[0.98, 0.01, 0.01]], [[0.01, 0.98, 0.01]]])
    pred = Prediction("classification", differ.log(), sample_probs=differ)
    assert pred.mutual_information.item() > 0.5
    lower, upper = pred.class_intervals(0.9)
    assert (lower <= upper).all() and lower.shape == (1, 3)


def test_regression_moments():
    means = torch.tensor([[0.0], [2.0]])
    scales = torch.tensor([[1.0], [1.0]])
    pred = Prediction("regression", means, sample_means=means, sample_scales=scales)
    assert pred.mean.item() == 1.0
    assert pred.epistemic_variance.item() == 1.0 and pred.aleatoric_variance.item() == 1.0
    lo, hi = pred.interval(0.95)
    assert torch.allclose(hi - lo, torch.tensor([2 * 1.959964 * 2**0.5]), rtol=1e-5)
