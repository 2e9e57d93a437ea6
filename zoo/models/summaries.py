"""Held-out metrics of a predictive accumulated online over blocks of sampled networks.

A predictive of ``S`` sampled networks on ``N`` inputs is an ``S x N x outputs`` array; the
metrics a likelihood reports depend on it only through per-input sums over the networks, so
they can be accumulated block by block (``add``) and read once (``metrics``), holding
``N x outputs`` numbers whatever ``S`` is. Sums are kept in float64.

Classification (:class:`ClassificationSummary`)
    ``sum_s p_s(c | x_n)``: the predictive probabilities ``p(c | x_n)``, from which accuracy,
    NLL, Brier score and ECE follow.
Regression (:class:`RegressionSummary`)
    ``sum_s mu_s``, ``sum_s mu_s^2`` and ``sum_s sigma_s^2`` (the predictive mean and the law
    of total variance, hence the moment-matched 95% interval of
    :meth:`zoo.RegressionPrediction.interval`), and ``logsumexp_s log N(y_n | mu_s, sigma_s^2)``
    (the mixture's log predictive density, by ``logaddexp`` from block to block).
"""

from __future__ import annotations

import math

import torch

from zoo import metrics
from zoo.models.predictions import (
    ClassificationPrediction,
    Prediction,
    RegressionPrediction,
    moment_interval,
)

__all__ = ["ClassificationSummary", "RegressionSummary", "Summary"]


class Summary:
    """Running sums of a predictive against targets ``y``: :meth:`add` a block of sampled
    networks' prediction (same inputs, any number of networks), then read :meth:`metrics`."""

    def __init__(self, y: torch.Tensor):
        self.y = y
        self.count = 0

    def add(self, prediction: Prediction) -> None:
        """Add a block of sampled networks' prediction on the same inputs."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """The likelihood's metrics of the predictive made of every block added."""
        raise NotImplementedError

    def condensed(self) -> Prediction:
        """A prediction of one "network" with the predictive's probabilities (classification)
        or mean and total variance (regression): every quantity of the predictive that is not
        a property of single networks (``probs``, ``mean``, ``variance``, ``interval``) is the
        whole prediction's; what distances to a reference read
        (:mod:`zoo.evaluation.agreement`)."""
        raise NotImplementedError

    def _counted(self, prediction: Prediction, kind: type) -> None:
        if not isinstance(prediction, kind):
            raise TypeError(f"{type(self).__name__} adds {kind.__name__}s, got {prediction!r}")
        self.count += prediction.num_samples

    def _check(self) -> None:
        if not self.count:
            raise ValueError(f"{type(self).__name__} has no sampled network yet: add one")


class ClassificationSummary(Summary):
    """Accuracy, NLL, Brier score and ECE (15 bins) of the predictive probabilities, as
    :meth:`zoo.models.likelihoods.Categorical.metrics` reports them."""

    def __init__(self, y: torch.Tensor):
        super().__init__(y)
        self.sum_probs: torch.Tensor | None = None

    def add(self, prediction: Prediction) -> None:
        """Add a block's sampled networks' class probabilities to the sums."""
        self._counted(prediction, ClassificationPrediction)
        assert isinstance(prediction, ClassificationPrediction)  # for the checker
        part = prediction.sample_probs.sum(0, dtype=torch.float64)
        self.sum_probs = part if self.sum_probs is None else self.sum_probs + part

    @property
    def probs(self) -> torch.Tensor:
        """``(N, C)`` predictive probabilities so far (float32, as a prediction's)."""
        self._check()
        assert self.sum_probs is not None
        return (self.sum_probs / self.count).float()

    def condensed(self) -> ClassificationPrediction:
        """One "network" whose probabilities are the predictive's."""
        probs = self.probs.unsqueeze(0)
        return ClassificationPrediction(probs.clamp_min(1e-30).log(), sample_probs=probs)

    def metrics(self) -> dict[str, float]:
        """``accuracy``, ``nll``, ``brier`` and ``ece`` of the predictive so far."""
        probs = self.probs
        return {
            "accuracy": metrics.accuracy(probs, self.y),
            "nll": metrics.nll(probs, self.y),
            "brier": metrics.brier(probs, self.y),
            "ece": metrics.ece(probs, self.y),
        }


class RegressionSummary(Summary):
    """RMSE of the predictive mean, the mixture's NLL and the coverage of its moment-matched
    95% interval, as :meth:`zoo.models.likelihoods.Gaussian.metrics` reports them."""

    def __init__(self, y: torch.Tensor):
        super().__init__(y)
        self.sums: list[torch.Tensor] | None = None  # mu, mu^2, sigma^2
        self.log_density: torch.Tensor | None = None  # logsumexp_s log N(y | mu_s, sigma_s)

    def add(self, prediction: Prediction) -> None:
        """Add a block's sampled means, noise variances and log densities of ``y``."""
        self._counted(prediction, RegressionPrediction)
        assert isinstance(prediction, RegressionPrediction)
        means, scales = prediction.sample_means.double(), prediction.sample_scales.double()
        y = self.y.reshape(means.shape[1:]).to(means)
        parts = [means.sum(0), means.pow(2).sum(0), scales.pow(2).sum(0)]
        self.sums = parts if self.sums is None else [a + b for a, b in zip(self.sums, parts)]
        logp = torch.distributions.Normal(means, scales).log_prob(y)
        logp = torch.logsumexp(logp.reshape(logp.shape[0], logp.shape[1], -1).sum(-1), 0)
        self.log_density = logp if self.log_density is None else torch.logaddexp(
            self.log_density, logp
        )  # fmt: skip

    @property
    def mean(self) -> torch.Tensor:
        """``(N[, D])`` predictive mean so far."""
        self._check()
        assert self.sums is not None
        return (self.sums[0] / self.count).float()

    @property
    def variance(self) -> torch.Tensor:
        """``(N[, D])`` predictive variance so far: the sampled means' variance plus the mean
        noise variance."""
        self._check()
        assert self.sums is not None
        mean = self.sums[0] / self.count
        epistemic = (self.sums[1] / self.count - mean.pow(2)).clamp_min(0)
        return (epistemic + self.sums[2] / self.count).float()

    def interval(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """The moment-matched central ``level`` interval (as a prediction's)."""
        return moment_interval(self.mean, self.variance, level)

    def condensed(self) -> RegressionPrediction:
        """One "network" whose mean and noise variance are the predictive's mean and total
        variance."""
        mean = self.mean.unsqueeze(0)
        outputs = mean if mean.dim() > 2 else mean.unsqueeze(-1)
        return RegressionPrediction(
            outputs, sample_means=mean, sample_scales=self.variance.sqrt().unsqueeze(0)
        )

    def metrics(self) -> dict[str, float]:
        """``rmse``, ``nll`` and ``coverage_95`` of the predictive so far."""
        mean = self.mean
        y = self.y.reshape(mean.shape)
        lower, upper = self.interval(0.95)
        assert self.log_density is not None
        nll = -(self.log_density - math.log(self.count)).mean().item()
        return {
            "rmse": metrics.rmse(mean, y),
            "nll": nll,
            "coverage_95": metrics.interval_coverage(lower, upper, y),
        }
