"""The prior predictive: what a network believes before it sees data (:func:`prior_predictive`)."""

from __future__ import annotations

from typing import cast

import torch

from zoo.arguments import check_positive, check_seed
from zoo.evaluation.bounds import check_prediction_size
from zoo.models.base import BayesianModel
from zoo.models.predictions import PredictionT
from zoo.models.statistics import evaluation_mode, frozen_statistics, training_mode
from zoo.runtime.rng import seeded


@torch.no_grad()
def prior_predictive(
    model: BayesianModel[PredictionT],
    x: torch.Tensor,
    num_samples: int = 100,
    seed: int | None = 0,
    statistics: str = "batch",
) -> PredictionT:
    """The prior predictive of ``model`` at inputs ``x``: ``num_samples`` networks drawn from
    the model's prior (every weight site, the prior's own latent scales and a learned noise
    drawn too), each evaluated on ``x``.

    Look at it before fitting: a prior under which a network is near-certain on noise
    (``prediction.sample_probs.max(-1).values.mean()`` near 1 for classification) says more
    than the data will undo on a short budget; ``N(0, 1)`` on every weight of a deep network
    is such a prior, ``N(0, 2 / fan_in)`` per layer (a converted network's default) is not.

    Parameters
    ----------
    model : BayesianModel
        A zoo model (``zoo.models.*``, ``zoo.models.from_module``).
    x : Tensor
        Inputs ``(N, ...)``, one batch, on any device (moved to the model's).
    num_samples : int, default 100
        Prior draws ``S``, made one at a time (one copy of the weights at once).
    seed : int or None, default 0
        Fixes the draws without changing the caller's random state (``None``: the global
        generator, advanced).
    statistics : {"batch", "running"}, default "batch"
        How batch norm normalises: with the statistics of ``x`` (the default: running
        statistics were gathered under other weights than a prior draw's, a trained network's
        or none at all; the running ones are left unchanged), or with the running statistics,
        as predictions do.

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
    if statistics not in ("batch", "running"):
        raise ValueError(f"statistics must be 'batch' or 'running', got {statistics!r}")
    device = next(model.parameters()).device
    check_prediction_size(model, x, num_samples, device, "prior_predictive")
    x = x.to(device)
    mode = training_mode if statistics == "batch" else evaluation_mode
    outputs, draws = [], []
    with seeded(seed, device), mode(model), frozen_statistics():
        for _ in range(int(num_samples)):
            params = model.sample_parameters()
            outputs.append(model.network(x, params))
            draws.append({k: v for k, v in params.items() if k not in model.site_shapes})
    latent = {k: torch.stack([d[k] for d in draws]) for k in draws[0]}  # noise, prior scales
    return cast(PredictionT, model.likelihood.predict(torch.stack(outputs), latent))
