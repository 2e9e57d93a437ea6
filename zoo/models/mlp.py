"""Bayesian multilayer perceptrons for regression and classification."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from zoo.models.base import BayesianModel
from zoo.priors import Prior

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "silu": nn.SiLU}


def mlp_network(
    in_features: int, hidden: Sequence[int], out_features: int, activation: str = "relu"
) -> nn.Sequential:
    """``fc1 -> act -> fc2 -> ... -> fcL`` with layers named ``fc1`` ... ``fcL``."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    sizes = [int(in_features), *[int(h) for h in hidden], int(out_features)]
    if any(s < 1 for s in sizes):
        raise ValueError(f"layer sizes must be positive, got {sizes}")
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        layers[f"fc{i}"] = nn.Linear(a, b)
        if i < len(sizes) - 1:
            layers[f"act{i}"] = _ACTIVATIONS[activation]()
    return nn.Sequential(layers)


class BayesianMLP(BayesianModel):
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
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)``.
    noise : float or {"learned", "heteroscedastic"}, default 0.1
        Regression observation noise (a standard deviation, in the units of ``y``: standardise
        targets of another scale or set it), see :class:`BayesianModel`.
    activation : {"relu", "tanh", "gelu", "silu"}
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (100,),
        out_features: int = 1,
        task: str = "regression",
        prior: Prior | float | None = None,
        noise: float | str = 0.1,
        activation: str = "relu",
        noise_prior_scale: float = 1.0,
    ):
        width = out_features * (2 if noise == "heteroscedastic" else 1)
        super().__init__(
            mlp_network(in_features, hidden, width, activation),
            task=task,
            prior=prior,
            noise=noise,
            noise_prior_scale=noise_prior_scale,
            input_shape=(int(in_features),),
        )
