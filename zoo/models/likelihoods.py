"""Likelihood objects: how a network's output explains the targets.

A model holds one likelihood (``BayesianModel(net, likelihood=...)``; ``task=`` is a shortcut).
Each likelihood owns its observation distribution, its latent sites (a learned noise scale),
the checks of its targets, the prediction type it returns and the metrics that suit it, so no
other module branches on the kind of task.

==========================  ====================================  ===========================
likelihood                  observation                           metrics
==========================  ====================================  ===========================
:class:`Categorical`        ``Categorical(logits=out)``           accuracy, nll, brier, ece
:class:`Gaussian`           ``Normal(out, noise)``, noise fixed   rmse, nll, coverage_95
                            or a latent site ``noise``
:class:`HeteroscedasticGaussian`  ``Normal(out[:D], softplus(out[D:]))``  rmse, nll, coverage_95
==========================  ====================================  ===========================

Likelihoods are ``nn.Module``s whose numbers are buffers, so they move with the model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn

from zoo import metrics
from zoo.models.predictions import (
    ClassificationPrediction,
    Prediction,
    RegressionPrediction,
    mixture,
)
from zoo.models.summaries import ClassificationSummary, RegressionSummary, Summary


class Likelihood(nn.Module):
    """Base class. Subclasses define :meth:`distribution`, :meth:`predict` and the checks."""

    #: A label for results and messages (``"classification"`` or ``"regression"``).
    task: str = ""
    #: Network outputs per target value (2 when the network also predicts a noise scale).
    outputs_per_target: int = 1

    def sample_latent(self) -> dict[str, torch.Tensor]:
        """``pyro.sample`` the likelihood's own latent sites (none by default)."""
        return {}

    def distribution(
        self, out: torch.Tensor, params: Mapping[str, torch.Tensor]
    ) -> dist.TorchDistribution:
        """The observation distribution for network output ``out`` (batch ``(*S, B)``)."""
        raise NotImplementedError

    def forward(self, out: torch.Tensor, params: Mapping[str, torch.Tensor]):
        """``likelihood(out, params)`` is :meth:`distribution`."""
        return self.distribution(out, params)

    def check_targets(self, y: torch.Tensor, num_outputs: int | None, offset: int = 0) -> None:
        """Check target values (before training; ``num_outputs`` is the network's width); an
        error names the first bad item, ``offset`` + its row."""

    def check_scale(self, y: torch.Tensor) -> None:
        """Warn when the targets' scale does not suit the likelihood (a fixed noise)."""

    def check_target_shape(self, y: torch.Tensor, out: torch.Tensor) -> None:
        """Check the shape of targets ``(B, ...)`` against the network output ``out``."""

    def predict(self, outputs: torch.Tensor, params: Mapping[str, torch.Tensor]) -> Prediction:
        """The prediction object for outputs ``(S, N, ...)`` of ``S`` sampled networks."""
        raise NotImplementedError

    def metrics(self, prediction: Prediction, y: torch.Tensor) -> dict[str, float]:
        """Held-out metrics of ``prediction`` against targets ``y``."""
        raise NotImplementedError

    def summary(self, y: torch.Tensor) -> Summary:
        """An accumulator of :meth:`metrics` against targets ``y`` over blocks of sampled
        networks (:mod:`zoo.models.summaries`): by default one that keeps the blocks and
        scores their mixture; the library's likelihoods keep per-input sums only."""
        return _Kept(self, y)

    def spec(self) -> dict:
        """Plain data that rebuilds this likelihood (:func:`from_spec`)."""
        return {"class": type(self).__name__, "args": {}}

    def point_losses(self, out: torch.Tensor, y: torch.Tensor) -> tuple[float, float] | None:
        """How well one network's output ``out`` (``(B, ...)``) explains ``y``, beside the best
        constant prediction of the same ``y``: ``(network's loss, constant's loss)`` in one
        unit, lower better; ``None`` when the likelihood cannot say (a user's likelihood that
        does not define it). ``zoo.fit`` reads it to tell a trained network from a fresh one
        (:mod:`zoo.training.start`)."""
        return None


def check_finite_outputs(outputs: torch.Tensor) -> None:
    """Refuse sampled networks' outputs ``(S, N, ...)`` that hold NaN or infinite values (no
    prediction can be scored from them), naming the first draw and input that does."""
    finite = torch.isfinite(outputs)
    if bool(finite.all()):
        return
    bad = (~finite).reshape(outputs.shape[0], outputs.shape[1], -1).any(-1)
    draw, row = (int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"the network's outputs hold NaN or infinite values ({int(bad.sum())} of "
        f"{bad.numel()} (draw, input) pairs; the first: draw {draw}, input {row}): check the "
        "network's forward for operations that overflow at these inputs (a log or division "
        "of a value that reaches 0) and the fit for divergence (fit.losses)"
    )


class _Kept(Summary):
    """The blocks themselves, scored as one prediction (a likelihood without running sums)."""

    def __init__(self, likelihood: Likelihood, y: torch.Tensor):
        super().__init__(y)
        self.likelihood = likelihood
        self.parts: list[Prediction] = []

    def add(self, prediction: Prediction) -> None:
        """Keep the block."""
        self._counted(prediction, Prediction)
        self.parts.append(prediction)

    def metrics(self) -> dict[str, float]:
        """The likelihood's metrics of the kept blocks side by side."""
        self._check()
        whole = self.parts[0] if len(self.parts) == 1 else mixture(self.parts)
        return self.likelihood.metrics(whole, self.y)


class Categorical(Likelihood):
    """``y ~ Categorical(logits=out)``: ``y`` holds class indices in ``[0, C)``."""

    task = "classification"

    def distribution(self, out, params):
        return dist.Categorical(logits=out)

    def check_targets(self, y, num_outputs, offset=0):
        check_labels(y, num_outputs, offset)

    def predict(self, outputs, params):
        check_finite_outputs(outputs)
        lik = self.distribution(outputs, params)
        return ClassificationPrediction(outputs, likelihood=lik, sample_probs=outputs.softmax(-1))

    def summary(self, y):
        return ClassificationSummary(y)

    def point_losses(self, out, y):
        """Mean cross-entropy of the logits, beside that of the labels' own frequencies (their
        entropy, the best constant prediction), in nats."""
        y = y.long().reshape(-1)
        network = float(F.cross_entropy(out.float(), y))
        freq = torch.bincount(y, minlength=out.shape[-1]).double() / len(y)
        constant = float(-(freq[freq > 0] * freq[freq > 0].log()).sum())
        return network, constant

    def metrics(self, prediction, y):
        probs = prediction.probs
        return {
            "accuracy": metrics.accuracy(probs, y),
            "nll": metrics.nll(probs, y),
            "brier": metrics.brier(probs, y),
            "ece": metrics.ece(probs, y),
        }


class _GaussianBase(Likelihood):
    task = "regression"

    def predict(self, outputs, params):
        check_finite_outputs(outputs)
        lik = self.distribution(outputs, params)
        return RegressionPrediction(
            outputs, likelihood=lik, sample_means=lik.mean, sample_scales=lik.stddev
        )

    def summary(self, y):
        return RegressionSummary(y)

    def point_losses(self, out, y):
        """Mean squared error of the predicted means, beside that of the targets' own mean
        (their variance, the best constant prediction), in squared units of ``y``."""
        half = out.shape[-1] // self.outputs_per_target if self.outputs_per_target > 1 else None
        mean = (out[..., :half] if half is not None else out).float()
        y = y.float().reshape(mean.shape)
        return float((mean - y).pow(2).mean()), float((y - y.mean(0)).pow(2).mean())

    def metrics(self, prediction, y):
        y = y.reshape(prediction.mean.shape)
        lower, upper = prediction.interval(0.95)
        return {
            "rmse": metrics.rmse(prediction.mean, y),
            "nll": metrics.gaussian_mixture_nll(
                prediction.sample_means, prediction.sample_scales, y
            ),
            "coverage_95": metrics.interval_coverage(lower, upper, y),
        }

    def check_target_shape(self, y, out):
        width = out.shape[-1] // self.outputs_per_target
        want = (width,) if width > 1 else ()
        if tuple(y.shape[1:]) != want:
            hint = ""
            if not want and tuple(y.shape[1:]) == (1,):
                hint = "; pass y.squeeze(-1)"
            elif y.shape[1:].numel() == math.prod(want):
                hint = f"; pass y.reshape(-1{''.join(', ' + str(s) for s in want)})"
            raise ValueError(
                f"regression targets must have shape {shape_n(want)} for this model, got y of "
                f"shape {shape_n(tuple(y.shape[1:]))}{hint}"
            )

    @staticmethod
    def _normal(loc: torch.Tensor, scale: torch.Tensor) -> dist.TorchDistribution:
        if loc.shape[-1] == 1:
            return dist.Normal(loc.squeeze(-1), scale.squeeze(-1))
        return dist.Normal(loc, scale).to_event(1)


class Gaussian(_GaussianBase):
    """``y ~ Normal(out, noise)`` with a fixed or learned noise standard deviation.

    Parameters
    ----------
    noise : float or "learned", default "learned"
        ``"learned"`` adds a latent site ``noise`` (a standard deviation) with a
        ``HalfNormal(noise_prior_scale)`` prior, which the guide fits (the default: on real
        data the noise level is rarely known, see the README's regression defaults); a float
        is a fixed standard deviation in the units of ``y``.
    noise_prior_scale : float, default 1.0
        Scale of the ``HalfNormal`` prior of a learned noise.
    """

    noise: torch.Tensor  # a buffer (0-d): the fixed noise, or
    noise_prior_scale: torch.Tensor  # the learned noise's prior scale

    def __init__(self, noise: float | str = "learned", noise_prior_scale: float = 1.0):
        super().__init__()
        self.learned = noise == "learned"
        if isinstance(noise, str) and not self.learned:
            raise ValueError(
                f"noise must be a positive float, 'learned' or 'heteroscedastic', got {noise!r}"
            )
        if not isinstance(noise, str) and not noise > 0:  # a string here is "learned"
            raise ValueError(f"noise must be positive, got {noise}")
        if not noise_prior_scale > 0:
            raise ValueError(f"noise_prior_scale must be positive, got {noise_prior_scale}")
        value = noise if not isinstance(noise, str) else noise_prior_scale
        self.register_buffer("noise_prior_scale" if self.learned else "noise", _scalar(value))

    #: A fixed noise this many times smaller than the targets' sd draws a warning.
    SCALE_WARNING = 30.0
    #: Targets whose sd is this many times a learned noise's prior scale draw a warning: the
    #: ``HalfNormal`` prior holds 99.7% of its mass below 3 times its scale.
    PRIOR_SCALE_WARNING = 10.0

    def check_scale(self, y):
        if y.numel() and not y.is_floating_point():
            values = int(torch.unique(y).numel())
            warnings.warn(
                f"the targets are {str(y.dtype).removeprefix('torch.')} with {values} distinct "
                "values, for a regression model (a Normal likelihood): if they are class labels, "
                "build the model with task='classification'; to regress on whole numbers, pass "
                "y.float() (this warning then goes)",
                UserWarning,
                stacklevel=4,
            )
            return
        if y.numel() < 2:
            return
        if self.learned:
            reference, limit = float(self.noise_prior_scale), self.PRIOR_SCALE_WARNING
            what = f"the scale of the learned noise's HalfNormal prior ({reference:g})"
            advice = (
                "the prior will hold the noise far below the targets' noise level. Standardise "
                "y (and rescale predictions back) or set noise_prior_scale to the targets' scale."
            )
        else:
            reference, limit = float(self.noise), self.SCALE_WARNING
            what = f"the fixed observation noise ({reference:g}, in the units of y)"
            advice = (
                "the fit will chase every target and its intervals will be far too narrow. "
                "Standardise y (and rescale predictions back), set noise to the targets' noise "
                "level, or use noise='learned'."
            )
        spread = float(y.std())
        if spread > limit * reference:
            warnings.warn(
                f"the targets' standard deviation ({spread:.4g}) is {spread / reference:.0f} "
                f"times {what}: {advice}",
                UserWarning,
                stacklevel=4,
            )

    def sample_latent(self):
        if not self.learned:
            return {}
        return {"noise": pyro.sample("noise", dist.HalfNormal(self.noise_prior_scale))}

    def distribution(self, out, params):
        scale = params["noise"] if self.learned else self.noise
        return self._normal(out, scale.reshape(scale.shape + (1, 1)))

    def spec(self):
        if self.learned:
            args = {"noise": "learned", "noise_prior_scale": float(self.noise_prior_scale)}
        else:
            args = {"noise": float(self.noise)}
        return {"class": "Gaussian", "args": args}

    def extra_repr(self) -> str:
        return "noise='learned'" if self.learned else f"noise={float(self.noise):g}"


class HeteroscedasticGaussian(_GaussianBase):
    """``y ~ Normal(out[..., :D], softplus(out[..., D:]) + 1e-6)``: the network predicts its own
    noise standard deviation, so it needs ``2 D`` outputs for ``D`` targets."""

    outputs_per_target = 2

    def distribution(self, out, params):
        half = out.shape[-1] // 2
        return self._normal(out[..., :half], F.softplus(out[..., half:]) + 1e-6)


_CLASSES = {c.__name__: c for c in (Categorical, Gaussian, HeteroscedasticGaussian)}


def from_task(
    task: str, noise: float | str = "learned", noise_prior_scale: float = 1.0
) -> Likelihood:
    """The likelihood that the ``task=`` shortcut names: ``"classification"`` ->
    :class:`Categorical`; ``"regression"`` -> :class:`Gaussian` (``noise`` ``"learned"``, the
    default, or a fixed standard deviation) or, with ``noise="heteroscedastic"``,
    :class:`HeteroscedasticGaussian`."""
    if task == "classification":
        return Categorical()
    if task == "regression":
        if noise == "heteroscedastic":
            return HeteroscedasticGaussian()
        return Gaussian(noise, noise_prior_scale)
    raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")


def from_spec(spec: dict) -> Likelihood:
    """The likelihood that :meth:`Likelihood.spec` describes."""
    cls = _CLASSES.get(spec.get("class", ""))
    if cls is None:
        raise ValueError(f"unknown likelihood {spec.get('class')!r}; known: {sorted(_CLASSES)}")
    return cls(**spec["args"])


def check_labels(y: torch.Tensor, num_classes: int | None, offset: int = 0) -> None:
    """Class labels: an integer tensor of shape ``(N,)`` with values in ``[0, num_classes)``;
    an error names the first bad item (``offset`` + its row)."""
    if y.is_floating_point():
        if not torch.equal(y, y.round()):
            raise ValueError(
                "classification labels must be integer class indices; got non-integer values. "
                "For real-valued targets the model needs a Gaussian likelihood: "
                "task='regression' (from_module and LeNet5 default to classification); for "
                "one-hot labels use y.argmax(-1)"
            )
        raise TypeError(
            f"classification labels must be an integer tensor, got {y.dtype}; use y.long() (or "
            "task='regression' if the targets are real values)"
        )
    if y.dim() != 1:
        raise ValueError(
            f"classification labels must have shape (N,), got {tuple(y.shape)}"
            + ("; for one-hot labels use y.argmax(-1)" if y.dim() == 2 else "")
        )
    if y.numel() == 0:
        return
    bad = y < 0 if num_classes is None else (y < 0) | (y >= num_classes)
    if bad.any():
        first = int(bad.nonzero()[0])
        raise ValueError(
            f"labels must lie in [0, {num_classes}) for this model, got {int(y[first])} at item "
            f"{offset + first} (values in [{int(y.min())}, {int(y.max())}])"
        )


def shape_n(tail) -> str:
    """A shape with ``N`` for the data dimension, e.g. ``(N, 1, 28, 28)`` or ``(N,)``."""
    dims = ["N", *map(str, tail)]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(float(value))
