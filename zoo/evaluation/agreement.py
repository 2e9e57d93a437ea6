"""How close an approximate posterior predictive is to a reference one (HMC's), on the same
test inputs. Each number compares two :class:`~zoo.Prediction` objects of one input set.

Classification (Izmailov et al. 2021), with predictive probabilities ``p_n`` (approximation)
and ``q_n`` (reference), each ``p_n = 1/S sum_s softmax(f(x_n; w_s))``:

``agreement``
    ``1/N sum_n [argmax_k p_nk == argmax_k q_nk]``: 1 when the two predict the same class.
``total_variation``
    ``1/N sum_n 1/2 sum_k |p_nk - q_nk|``, in [0, 1]: 0 for identical predictives.

Regression, with each predictive's mean ``m_n`` and standard deviation ``s_n`` (the law of
total variance over draws: epistemic plus observation noise, as
:attr:`~zoo.RegressionPrediction.variance`):

``w2``
    ``1/N sum_n W2(N(m_n, s_n^2), N(m'_n, s'_n^2))`` with ``W2^2 = (m - m')^2 + (s - s')^2``:
    the 2-Wasserstein distance between the moment-matched Gaussian marginals, in the units of
    ``y``; 0 for identical moments. (The mixtures themselves are not Gaussian; matching two
    moments is the documented equivalent.)
``sd_ratio``
    ``exp(1/N sum_n log(s_n / s'_n))``, the geometric mean ratio of predictive standard
    deviations: below 1 the approximation is too confident, above 1 too wide.
``reference_coverage``
    ``1/N sum_n P_ref(l_n <= y <= u_n)``, the reference predictive's probability of the
    approximation's central 95% interval ``[l_n, u_n]``, computed exactly from the reference
    draws' Gaussians: 0.95 when the intervals carry the reference's 95%.
"""

from __future__ import annotations

import math
from typing import cast

import torch

from zoo.models.predictions import ClassificationPrediction, Prediction, RegressionPrediction


def agreement(pred: ClassificationPrediction, ref: ClassificationPrediction) -> float:
    """Fraction of inputs where the two predictives' most probable classes coincide."""
    _same_inputs(pred, ref, ClassificationPrediction)
    return (
        (pred.probs.argmax(-1) == ref.probs.argmax(-1).to(pred.probs.device)).double().mean().item()
    )


def total_variation(pred: ClassificationPrediction, ref: ClassificationPrediction) -> float:
    """Mean over inputs of the total variation distance between the class predictives."""
    _same_inputs(pred, ref, ClassificationPrediction)
    diff = pred.probs.double() - ref.probs.double().to(pred.probs.device)
    return (0.5 * diff.abs().sum(-1)).mean().item()


def w2(pred: RegressionPrediction, ref: RegressionPrediction) -> float:
    """Mean 2-Wasserstein distance between moment-matched Gaussian predictive marginals."""
    _same_inputs(pred, ref, RegressionPrediction)
    m, s, m_ref, s_ref = _moments(pred, ref)
    return ((m - m_ref).pow(2) + (s - s_ref).pow(2)).sqrt().mean().item()


def sd_ratio(pred: RegressionPrediction, ref: RegressionPrediction) -> float:
    """Geometric mean over inputs of the ratio of predictive standard deviations."""
    _same_inputs(pred, ref, RegressionPrediction)
    _, s, _, s_ref = _moments(pred, ref)
    return (s.log() - s_ref.log()).mean().exp().item()


def reference_coverage(
    pred: RegressionPrediction, ref: RegressionPrediction, level: float = 0.95
) -> float:
    """Mean reference predictive probability of the approximation's central ``level``
    interval (exact for the reference's mixture of Gaussians)."""
    _same_inputs(pred, ref, RegressionPrediction)
    lower, upper = (t.double() for t in pred.interval(level))
    means = ref.sample_means.double().to(lower.device)
    scales = ref.sample_scales.double().to(lower.device).expand_as(means)
    normal = torch.distributions.Normal(means, scales)
    mass = normal.cdf(upper.expand_as(means)) - normal.cdf(lower.expand_as(means))
    return mass.mean(0).mean().item()


def distances(pred: Prediction, ref: Prediction) -> dict[str, float]:
    """Every distance of the task: ``agreement`` and ``total_variation`` (classification), or
    ``w2``, ``sd_ratio`` and ``reference_coverage`` (regression)."""
    # ``ref``'s type is checked by each distance (``_same_inputs``), with the error it names
    if isinstance(pred, ClassificationPrediction):
        c_ref = cast(ClassificationPrediction, ref)
        return {
            "agreement": agreement(pred, c_ref),
            "total_variation": total_variation(pred, c_ref),
        }
    if isinstance(pred, RegressionPrediction):
        r_ref = cast(RegressionPrediction, ref)
        return {
            "w2": w2(pred, r_ref),
            "sd_ratio": sd_ratio(pred, r_ref),
            "reference_coverage": reference_coverage(pred, r_ref),
        }
    raise TypeError(f"no distances for a {type(pred).__name__}")


def _moments(pred: RegressionPrediction, ref: RegressionPrediction):
    device = pred.sample_means.device
    m, s = pred.mean.double(), pred.variance.double().sqrt()
    m_ref, s_ref = ref.mean.double().to(device), ref.variance.double().sqrt().to(device)
    return m, s, m_ref, s_ref


def _same_inputs(pred: Prediction, ref: Prediction, kind: type) -> None:
    """Both predictions of the expected kind, on the same number of inputs."""
    for name, p in (("prediction", pred), ("reference", ref)):
        if not isinstance(p, kind):
            raise TypeError(f"the {name} is a {type(p).__name__}, expected a {kind.__name__}")
    n, n_ref = pred.outputs.shape[1], ref.outputs.shape[1]
    if n != n_ref:
        raise ValueError(
            f"the prediction covers {n} inputs and the reference {n_ref}: predict both on the "
            "same test inputs"
        )
    if not math.isfinite(pred.outputs.float().sum().item()):
        raise ValueError("the prediction has non-finite outputs")
