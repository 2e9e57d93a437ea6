"""Metrics on tensors, with their formulas.

Classification metrics take predictive class probabilities ``probs`` of shape ``(N, C)``
(already averaged over posterior samples) and class indices ``labels`` ``(N,)``. Calibration
error and AUROC come from torchmetrics; the rest is a line each.
"""

from __future__ import annotations

import math

import torch


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of ``argmax probs == labels``."""
    return (probs.argmax(-1) == labels).double().mean().item()


def nll(probs: torch.Tensor, labels: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean negative log predictive probability of the true class, ``-mean_n log p(y_n | x_n)``."""
    p = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -(p.double().clamp_min(eps).log().mean().item())


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over examples of ``sum_c (p_c - 1[y = c])^2`` (0 is perfect, 2 the worst)."""
    onehot = torch.nn.functional.one_hot(labels, probs.shape[-1]).to(probs.dtype)
    return (probs - onehot).pow(2).sum(-1).double().mean().item()


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, ``n_bins`` equal-width bins.

    ``ECE = sum_b (|B_b| / N) |accuracy(B_b) - mean confidence(B_b)|``, where the confidence of
    an example is its largest predictive probability (torchmetrics' ``l1`` calibration error).
    """
    from torchmetrics.functional.classification import multiclass_calibration_error

    return multiclass_calibration_error(
        probs.float(), labels, num_classes=probs.shape[-1], n_bins=n_bins, norm="l1"
    ).item()


def reliability(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> dict:
    """Per-bin ``confidence``, ``accuracy`` and ``count`` of the top label (equal-width bins);
    the data of a reliability diagram. Empty bins have NaN confidence and accuracy."""
    conf, pred = probs.max(-1)
    correct = (pred == labels).double()
    conf = conf.double()
    bins = torch.clamp((conf * n_bins).ceil().long() - 1, 0, n_bins - 1)
    zeros = torch.zeros(n_bins, dtype=torch.float64, device=conf.device)
    count = zeros.index_add(0, bins, torch.ones_like(conf))
    with torch.no_grad():
        mean_conf = zeros.index_add(0, bins, conf) / count
        mean_acc = zeros.index_add(0, bins, correct) / count
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    return {"edges": edges, "confidence": mean_conf, "accuracy": mean_acc, "count": count}


def ood_auroc(score_in: torch.Tensor, score_out: torch.Tensor) -> float:
    """AUROC of telling out-of-distribution from in-distribution inputs by a score (higher
    means "more likely out", e.g. predictive entropy or mutual information); 0.5 is chance."""
    from torchmetrics.functional.classification import binary_auroc

    scores = torch.cat([score_in, score_out]).float()
    target = torch.cat([torch.zeros(len(score_in)), torch.ones(len(score_out))]).long()
    return binary_auroc(scores, target.to(scores.device)).item()


def rmse(mean: torch.Tensor, target: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean."""
    return (mean - target).double().pow(2).mean().sqrt().item()


def gaussian_nll(mean: torch.Tensor, variance: torch.Tensor, target: torch.Tensor) -> float:
    """Mean negative log density of ``target`` under ``N(mean, variance)``."""
    var = variance.double()
    return (
        (0.5 * (torch.log(2 * math.pi * var) + (target - mean).double().pow(2) / var)).mean().item()
    )


def gaussian_mixture_nll(means: torch.Tensor, scales: torch.Tensor, target: torch.Tensor) -> float:
    """Mean negative log predictive density of ``target`` under the equal-weight mixture
    ``1/S sum_s N(mean_s, scale_s^2)``; ``means``, ``scales`` are ``(S, N, ...)``."""
    logp = torch.distributions.Normal(means.double(), scales.double()).log_prob(target.double())
    logp = logp.reshape(logp.shape[0], logp.shape[1], -1).sum(-1)
    return -(torch.logsumexp(logp, 0) - math.log(means.shape[0])).mean().item()


def interval_coverage(lower: torch.Tensor, upper: torch.Tensor, target: torch.Tensor) -> float:
    """Fraction of targets inside ``[lower, upper]``."""
    return ((target >= lower) & (target <= upper)).double().mean().item()


def certainty_table(
    sample_probs: torch.Tensor, labels: torch.Tensor, level: float = 0.95
) -> dict[str, int]:
    """Posch & Pilz's certainty table from ``S`` sampled networks' probabilities ``(S, N, C)``.

    A prediction (the argmax of the mean probability) is *quite certain* when the central
    ``level`` credible interval of its class's probability over the ``S`` samples overlaps no
    other class's interval, i.e. its lower bound exceeds every other class's upper bound.

    Returns counts ``certain_correct``, ``uncertain_correct``, ``certain_wrong``,
    ``uncertain_wrong`` (they add up to ``N``).
    """
    alpha = (1 - level) / 2
    q = torch.tensor([alpha, 1 - alpha], dtype=sample_probs.dtype, device=sample_probs.device)
    lower, upper = torch.quantile(sample_probs, q, dim=0)
    pred = sample_probs.mean(0).argmax(-1)
    pred_lower = lower.gather(-1, pred.unsqueeze(-1)).squeeze(-1)
    others_upper = upper.scatter(-1, pred.unsqueeze(-1), float("-inf")).max(-1).values
    certain = pred_lower > others_upper
    correct = pred == labels
    return {
        "certain_correct": int((certain & correct).sum()),
        "uncertain_correct": int((~certain & correct).sum()),
        "certain_wrong": int((certain & ~correct).sum()),
        "uncertain_wrong": int((~certain & ~correct).sum()),
    }
