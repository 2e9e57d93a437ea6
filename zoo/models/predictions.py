"""What a posterior predictive returns: outputs of ``S`` sampled networks and the quantities
derived from them. The likelihood of the model decides which type (``zoo.models.likelihoods``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from zoo.arguments import is_number


@dataclass
class Prediction:
    """Outputs of ``S`` sampled networks on ``N`` inputs.

    Attributes
    ----------
    outputs : Tensor ``(S, N, ...)``
        Raw network outputs (logits for classification).
    likelihood : Distribution
        The observation distribution of every sampled network, batch ``(S, N)``.
    """

    outputs: torch.Tensor
    likelihood: torch.distributions.Distribution | None = None

    #: ``"classification"`` or ``"regression"`` (a label; the type carries the behaviour).
    task = ""

    def log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """``log p(y_n | x_n, w_s)`` of each sampled network, ``(S, N)``."""
        if self.likelihood is None:
            raise ValueError(
                f"this {type(self).__name__} holds no observation distribution (built without "
                "likelihood=); predict through a model to get one"
            )
        return self.likelihood.log_prob(y.to(self.outputs.device))

    @property
    def num_samples(self) -> int:
        return self.outputs.shape[0]


@dataclass
class ClassificationPrediction(Prediction):
    """A categorical predictive. ``sample_probs``: ``(S, N, C)`` class probabilities of each
    sampled network."""

    sample_probs: torch.Tensor = field(kw_only=True)
    task = "classification"

    @property
    def probs(self) -> torch.Tensor:
        """Predictive probabilities ``1/S sum_s p(y | x, w_s)``, ``(N, C)``."""
        return self.sample_probs.mean(0)

    @property
    def entropy(self) -> torch.Tensor:
        """Predictive entropy ``H[mean_s p_s]`` (total uncertainty), ``(N,)``."""
        return _entropy(self.probs)

    @property
    def expected_entropy(self) -> torch.Tensor:
        """``mean_s H[p_s]`` (aleatoric part), ``(N,)``."""
        return _entropy(self.sample_probs).mean(0)

    @property
    def mutual_information(self) -> torch.Tensor:
        """``H[mean p] - mean H[p]`` (epistemic part, BALD), ``(N,)``; 0 when samples agree."""
        return (self.entropy - self.expected_entropy).clamp_min(0)

    def class_intervals(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """Central ``level`` credible interval of each class probability over the ``S``
        sampled networks: ``(lower, upper)``, each ``(N, C)``; ``level`` in (0, 1)."""
        check_level(level)
        alpha = (1 - level) / 2
        q = torch.tensor([alpha, 1 - alpha], dtype=self.sample_probs.dtype)
        lower, upper = torch.quantile(self.sample_probs, q.to(self.sample_probs.device), dim=0)
        return lower, upper


@dataclass
class RegressionPrediction(Prediction):
    """A Gaussian predictive. ``sample_means``, ``sample_scales``: ``(S, N[, D])`` mean and
    observation-noise standard deviation of each sampled network."""

    sample_means: torch.Tensor = field(kw_only=True)
    sample_scales: torch.Tensor = field(kw_only=True)
    task = "regression"

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean, ``(N[, D])``."""
        return self.sample_means.mean(0)

    @property
    def epistemic_variance(self) -> torch.Tensor:
        """Variance of the sampled means across networks."""
        return self.sample_means.var(0, unbiased=False)

    @property
    def aleatoric_variance(self) -> torch.Tensor:
        """Mean observation-noise variance across networks."""
        return self.sample_scales.pow(2).mean(0)

    @property
    def variance(self) -> torch.Tensor:
        """Total predictive variance (law of total variance)."""
        return self.epistemic_variance + self.aleatoric_variance

    def interval(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """Central ``level`` interval of the predictive, by a moment-matched Normal; ``level``
        in (0, 1) (0.95, not 95)."""
        return moment_interval(self.mean, self.variance, level)


#: The prediction type of a model and of a posterior over it: a
#: :class:`ClassificationPrediction` or a :class:`RegressionPrediction` (``Prediction`` when the
#: task is known only at run time). ``BayesianModel[PredictionT]`` and ``Posterior[PredictionT]``
#: carry it, so that a type checker sees ``fit.predict(x).probs`` on a classifier's fit.
PredictionT = TypeVar("PredictionT", bound=Prediction, covariant=True)


def moment_interval(
    mean: torch.Tensor, variance: torch.Tensor, level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The central ``level`` interval of ``N(mean, variance)`` (``level`` in (0, 1))."""
    check_level(level)
    z = math.sqrt(2) * torch.erfinv(torch.tensor(level, dtype=torch.float64)).item()
    sd = variance.sqrt()
    return mean - z * sd, mean + z * sd


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def check_level(level: float) -> None:
    """Refuse a credible level outside (0, 1), such as 95 for 95%."""
    if not is_number(level) or not 0 < level < 1:
        hint = (
            f" (for {level}% pass {level / 100:g})"
            if isinstance(level, (int, float)) and 1 < level < 100
            else ""
        )
        raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}{hint}")


def mixture(predictions: Sequence[Prediction]) -> Prediction:
    """The equal mixture of ``K`` predictions of the same task on the same inputs: their
    sampled networks side by side, ``S = sum_k S_k`` outputs (equal weights when every
    ``S_k`` is the same, as :func:`zoo.baselines.ensembles.ensemble` draws them).

    Raises ``ValueError`` for predictions of different types or inputs."""
    if not predictions:
        raise ValueError("a mixture needs at least one prediction")
    kind = type(predictions[0])
    shapes = {tuple(p.outputs.shape[1:]) for p in predictions}
    if any(type(p) is not kind for p in predictions) or len(shapes) > 1:
        raise ValueError(
            "a mixture's predictions must be of one type on the same inputs; got "
            f"{sorted({type(p).__name__ for p in predictions})} with output shapes "
            f"{sorted(shapes)}"
        )
    fields: dict[str, Any] = {}
    for name in kind.__dataclass_fields__:
        values = [getattr(p, name) for p in predictions]
        if name == "likelihood":
            fields[name] = _mixed_distribution(values)
        else:
            fields[name] = None if values[0] is None else torch.cat(values)
    return kind(**fields)


def _mixed_distribution(dists: list) -> torch.distributions.Distribution | None:
    """The observation distributions of ``K`` predictions concatenated along their first
    batch dimension (the sampled networks): Categorical, Normal, and either one made
    ``Independent``."""
    if dists[0] is None:
        return None
    first = dists[0]
    if isinstance(first, torch.distributions.Independent):
        base = _mixed_distribution([d.base_dist for d in dists])
        assert base is not None  # as the first's is not
        return torch.distributions.Independent(base, first.reinterpreted_batch_ndims)
    if isinstance(first, torch.distributions.Categorical):
        return type(first)(logits=torch.cat([d.logits for d in dists]))
    if isinstance(first, torch.distributions.Normal):
        return type(first)(torch.cat([d.loc for d in dists]), torch.cat([d.scale for d in dists]))
    raise TypeError(f"cannot mix predictions whose likelihood is a {type(first).__name__}")
