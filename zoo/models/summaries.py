"""Held-out metrics of a predictive accumulated online over blocks of sampled networks.

A predictive of ``S`` sampled networks on ``N`` inputs is an ``S x N x outputs`` array; the
metrics a likelihood reports depend on it only through per-input sums over the networks, so
they can be accumulated block by block (``add``) and read once (``metrics``), holding
``N x outputs`` numbers whatever ``S`` is. Sums are kept in float64.

Classification (:class:`ClassificationSummary`)
    ``sum_s p_s(c | x_n)``: the predictive probabilities ``p(c | x_n)``, from which accuracy,
    NLL, Brier score and ECE follow.
Regression (:class:`RegressionSummary`)
    the sampled means' running mean and sum of squared deviations from it, merged block by
    block by Chan, Golub and LeVeque's pairwise update (``M2 = M2_a + M2_b + delta^2 n_a n_b /
    n``, ``delta`` the blocks' difference of means), and ``sum_s sigma_s^2``: the predictive
    mean and the law of total variance, hence the moment-matched 95% interval of
    :meth:`zoo.RegressionPrediction.interval`. ``E[mu^2] - E[mu]^2`` would cancel
    catastrophically where the means are large against their spread (targets such as
    timestamps); the update does not. Also ``logsumexp_s log N(y_n | mu_s, sigma_s^2)`` (the
    mixture's log predictive density, by ``logaddexp`` from block to block). The mean and
    variance read back are in the predictions' own dtype.
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
        self.dtype = torch.float32  # the predictions' (float32 or float64)
        self.centre: torch.Tensor | None = None  # mean of the sampled means so far
        self.m2: torch.Tensor | None = None  # sum_s (mu_s - centre)^2
        self.noise: torch.Tensor | None = None  # sum_s sigma_s^2
        self.log_density: torch.Tensor | None = None  # logsumexp_s log N(y | mu_s, sigma_s)

    def add(self, prediction: Prediction) -> None:
        """Add a block's sampled means, noise variances and log densities of ``y``."""
        before = self.count
        self._counted(prediction, RegressionPrediction)
        assert isinstance(prediction, RegressionPrediction)
        self.dtype = prediction.sample_means.dtype
        means, scales = prediction.sample_means.double(), prediction.sample_scales.double()
        y = self.y.reshape(means.shape[1:]).to(means)
        size = means.shape[0]
        centre = means.mean(0)
        m2 = (means - centre).pow(2).sum(0)
        noise = scales.pow(2).sum(0)
        if self.centre is None or self.m2 is None or self.noise is None:
            self.centre, self.m2, self.noise = centre, m2, noise
        else:
            delta = centre - self.centre
            self.centre = self.centre + delta * (size / self.count)
            self.m2 = self.m2 + m2 + delta.pow(2) * (before * size / self.count)
            self.noise = self.noise + noise
        logp = torch.distributions.Normal(means, scales).log_prob(y)
        logp = torch.logsumexp(logp.reshape(logp.shape[0], logp.shape[1], -1).sum(-1), 0)
        self.log_density = logp if self.log_density is None else torch.logaddexp(
            self.log_density, logp
        )  # fmt: skip

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float64 predictive mean and total variance so far."""
        self._check()
        assert self.centre is not None and self.m2 is not None and self.noise is not None
        return self.centre, (self.m2 + self.noise) / self.count

    @property
    def mean(self) -> torch.Tensor:
        """``(N[, D])`` predictive mean so far."""
        return self._moments()[0].to(self.dtype)

    @property
    def variance(self) -> torch.Tensor:
        """``(N[, D])`` predictive variance so far: the sampled means' variance plus the mean
        noise variance."""
        return self._moments()[1].to(self.dtype)

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
        mean, variance = self._moments()
        y = self.y.reshape(mean.shape).to(mean)
        lower, upper = moment_interval(mean, variance, 0.95)
        assert self.log_density is not None
        nll = -(self.log_density - math.log(self.count)).mean().item()
        return {
            "rmse": metrics.rmse(mean, y),
            "nll": nll,
            "coverage_95": metrics.interval_coverage(lower, upper, y),
        }
