"""Bayesian multilayer perceptrons for regression and classification."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal, overload

from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.likelihoods import Likelihood, from_task
from zoo.models.predictions import (
    ClassificationPrediction,
    Prediction,
    PredictionT,
    RegressionPrediction,
)
from zoo.priors import Prior

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "silu": nn.SiLU}


def mlp_network(
    in_features: int, hidden: Sequence[int], out_features: int, activation: str = "relu"
) -> nn.Sequential:
    """``fc1 -> act -> fc2 -> ... -> fcL`` with layers named ``fc1`` ... ``fcL``."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    if isinstance(hidden, (int, str)) or not hasattr(hidden, "__iter__"):
        raise TypeError(f"hidden must be a sequence of widths, e.g. (100,), got {hidden!r}")
    sizes = [in_features, *hidden, out_features]
    check_sizes("the layer sizes (in_features, *hidden, out_features)", sizes)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        layers[f"fc{i}"] = nn.Linear(a, b)
        if i < len(sizes) - 1:
            layers[f"act{i}"] = _ACTIVATIONS[activation]()
    return nn.Sequential(layers)


class BayesianMLP(BayesianModel[PredictionT]):
    """Fully connected BNN: ``model(x, y=None)`` with ``x`` of shape ``(B, in_features)``.

    Parameters
    ----------
    in_features : int
        Input size.
    hidden : sequence of int, default (100,)
        Hidden layer widths (``()`` gives Bayesian linear regression).
    out_features : int, default 1
        Outputs: regression targets, or the number of classes for classification.
    task : {"regression", "classification"}
        Shortcut for the likelihood (see :class:`BayesianModel`).
    prior : Prior or float, optional
        Weight prior (see :class:`~zoo.models.base.BayesianModel`: a Prior, a number,
        ``"learned"`` or ``"hierarchical"``); default :func:`zoo.priors.default_prior` of the
        task (``N(0, gain^2 / fan_in)`` for regression, ``N(0, 1)`` for classification).
    noise : float or {"learned", "heteroscedastic"}, default "learned"
        Regression observation noise: learned (a latent standard deviation), fixed (a standard
        deviation in the units of ``y``) or predicted per input, see :class:`BayesianModel`.
    activation : {"relu", "tanh", "gelu", "silu"}
    noise_prior_scale : float, default 1.0
        Scale of the ``HalfNormal`` prior of a learned noise.
    likelihood : zoo.models.likelihoods.Likelihood, optional
        Instead of ``task`` and ``noise``; a heteroscedastic one doubles the last layer.
    input_shape : tuple of int, optional
        Shape of one input when it is not ``(in_features,)`` (e.g. ``(1, 28, 28)`` images):
        inputs are flattened first. Its product must be ``in_features``.
    """

    # The task in the type: BayesianMLP[RegressionPrediction] by default or with
    # task="regression", [ClassificationPrediction] with task="classification" (a keyword),
    # [Prediction] for a task known at run time.
    @overload
    def __init__(
        self: BayesianMLP[RegressionPrediction],
        in_features: int,
        hidden: Sequence[int] = ...,
        out_features: int = ...,
        task: Literal["regression"] = ...,
        prior: Prior | float | str | None = ...,
        noise: float | str = ...,
        activation: str = ...,
        noise_prior_scale: float = ...,
        likelihood: Likelihood | None = ...,
        input_shape: Sequence[int] | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: BayesianMLP[ClassificationPrediction],
        in_features: int,
        hidden: Sequence[int] = ...,
        out_features: int = ...,
        *,
        task: Literal["classification"],
        prior: Prior | float | str | None = ...,
        noise: float | str = ...,
        activation: str = ...,
        noise_prior_scale: float = ...,
        likelihood: Likelihood | None = ...,
        input_shape: Sequence[int] | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self: BayesianMLP[Prediction],
        in_features: int,
        hidden: Sequence[int] = ...,
        out_features: int = ...,
        task: str = ...,
        prior: Prior | float | str | None = ...,
        noise: float | str = ...,
        activation: str = ...,
        noise_prior_scale: float = ...,
        likelihood: Likelihood | None = ...,
        input_shape: Sequence[int] | None = ...,
    ) -> None: ...
    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (100,),
        out_features: int = 1,
        task: str = "regression",
        prior: Prior | float | str | None = None,
        noise: float | str = "learned",
        activation: str = "relu",
        noise_prior_scale: float = 1.0,
        likelihood: Likelihood | None = None,
        input_shape: Sequence[int] | None = None,
    ):
        if likelihood is None:
            likelihood = from_task(task, noise, noise_prior_scale)
        width = out_features * likelihood.outputs_per_target
        net = mlp_network(in_features, hidden, width, activation)
        shape = (int(in_features),) if input_shape is None else tuple(int(s) for s in input_shape)
        if shape != (int(in_features),):
            if math.prod(shape) != int(in_features):
                raise ValueError(
                    f"input_shape {shape} has {math.prod(shape)} elements, not in_features="
                    f"{in_features}"
                )
            net = nn.Sequential(OrderedDict([("flatten", nn.Flatten()), *net.named_children()]))
        super().__init__(net, likelihood=likelihood, prior=prior, input_shape=shape)
        self._args = {
            "in_features": int(in_features),
            "hidden": [int(h) for h in hidden],
            "out_features": int(out_features),
            "activation": activation,
            "input_shape": list(shape),
        }

    def spec(self) -> dict | None:
        spec = self._class_spec(**(self.__dict__.get("_args") or self._args_from_net()))
        if spec is not None:
            spec["args"]["likelihood"] = self.likelihood.spec()
        return spec

    def _args_from_net(self) -> dict:
        """The constructor's arguments read off the network (a model pickled by version 1)."""
        layers = [m for m in self.net.children() if isinstance(m, nn.Linear)]
        acts = [n for n, cls in _ACTIVATIONS.items() for m in self.net.children() if type(m) is cls]
        return {
            "in_features": layers[0].in_features,
            "hidden": [m.out_features for m in layers[:-1]],
            "out_features": layers[-1].out_features // self.likelihood.outputs_per_target,
            "activation": acts[0] if acts else "relu",
        }
