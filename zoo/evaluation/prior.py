"""The prior predictive: what a network believes before it sees data (:func:`prior_predictive`)."""

from __future__ import annotations

import torch

from zoo.arguments import check_positive, check_seed
from zoo.data.checks import check_inputs
from zoo.evaluation.predictive import predict
from zoo.models.base import BayesianModel
from zoo.models.predictions import Prediction
from zoo.runtime.rng import seeded


@torch.no_grad()
def prior_predictive(
    model: BayesianModel,
    x: torch.Tensor,
    num_samples: int = 100,
    seed: int | None = 0,
    progress: bool = True,
) -> Prediction:
    """The prior predictive of ``model`` at inputs ``x``: ``num_samples`` networks drawn from
    the model's prior (every weight site, the prior's own latent scales and a learned noise
    drawn too), each evaluated on ``x`` as :func:`zoo.predict` evaluates posterior draws (in
    evaluation mode: batch norm reads its running statistics).

    Look at it before fitting: a prior under which a network is near-certain on noise
    (``prediction.probs.max(-1).values.mean()`` near 1 for classification) says more than the
    data will undo on a short budget; ``N(0, 1)`` on every weight of a deep network is such a
    prior, ``N(0, 2 / fan_in)`` per layer (a converted network's default) is not.

    Parameters
    ----------
    model : BayesianModel
        A zoo model (``zoo.models.*``, ``zoo.models.from_module``).
    x : Tensor
        Inputs ``(N, ...)`` on any device (moved to the model's).
    num_samples : int, default 100
        Prior draws ``S``; they are held at once (``S`` copies of the weights).
    seed : int or None, default 0
        Fixes the draws without changing the caller's random state (``None``: the global
        generator, advanced).
    progress : bool, default True
        :func:`zoo.predict`'s bar over the passes (shown after two seconds).

    Returns
    -------
    Prediction
        As :func:`zoo.predict` returns it (``ClassificationPrediction`` or
        ``RegressionPrediction``), over the prior's ``S`` networks.
    """
    if not isinstance(model, BayesianModel):
        raise TypeError(
            f"prior_predictive needs a zoo model (zoo.models.*, from_module), got "
            f"{type(model).__name__}"
        )
    if num_samples is None:
        raise ValueError("num_samples must be a positive integer, got None")
    check_positive(num_samples=num_samples)
    check_seed(seed)
    device = next(model.parameters()).device
    check_inputs(model, x, device)
    with seeded(seed, device):
        draws = [model.sample_parameters() for _ in range(int(num_samples))]
    params = {name: torch.stack([d[name] for d in draws]) for name in draws[0]}
    return predict(model, None, x, params=params, progress=progress, seed=None)
