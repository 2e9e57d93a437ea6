"""Metrics on tensors. ``probs`` are predictive class probabilities ``(N, C)`` (already averaged
over posterior samples), ``labels`` class indices ``(N,)``.
"""

from __future__ import annotations

import math

import torch


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of ``argmax probs == labels``."""
    return (probs.argmax(-1) == labels).double().mean().item()


def nll(probs: torch.Tensor, labels: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean negative log predictive probability of the true class, ``-mean log p(y_n | x_n)``."""
    p = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -(p.double().clamp_min(eps).log().mean().item())


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over examples of ``sum_c (p_c - 1[y = c])^2`` (0 is perfect, 2 the worst)."""
    onehot = torch.nn.functional.one_hot(labels, probs.shape[-1]).to(probs.dtype)
    return (probs - onehot).pow(2).sum(-1).double().mean().item()


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error with ``n_bins`` equal-width confidence bins.

    ``ECE = sum_b (|B_b| / N) |accuracy(B_b) - mean confidence(B_b)|`` where the confidence of
    an example is its largest predictive probability.
    """
    conf, pred = probs.max(-1)
    correct = (pred == labels).double()
    conf = conf.double()
    bins = torch.clamp((conf * n_bins).ceil().long() - 1, 0, n_bins - 1)
    total = torch.zeros(n_bins, dtype=torch.float64, device=conf.device)
    gap = total.clone().index_add_(0, bins, correct - conf)
    return (gap.abs().sum() / max(len(conf), 1)).item()


def rmse(mean: torch.Tensor, target: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean."""
    return (mean - target).double().pow(2).mean().sqrt().item()


def gaussian_mixture_nll(means: torch.Tensor, scales: torch.Tensor, target: torch.Tensor) -> float:
    """Mean negative log predictive density of ``target`` under the equal-weight mixture
    ``1/S sum_s N(mean_s, scale_s^2)``; ``means``, ``scales`` are ``(S, N, ...)``."""
    logp = torch.distributions.Normal(means.double(), scales.double()).log_prob(target.double())
    logp = logp.reshape(logp.shape[0], logp.shape[1], -1).sum(-1)
    return -(torch.logsumexp(logp, 0) - math.log(means.shape[0])).mean().item()


def interval_coverage(lower: torch.Tensor, upper: torch.Tensor, target: torch.Tensor) -> float:
    """Fraction of targets inside ``[lower, upper]``."""
    return ((target >= lower) & (target <= upper)).double().mean().item()
