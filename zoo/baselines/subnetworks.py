"""``zoo.subnetwork_guide``: subnetwork inference as Daxberger et al. (ICML 2021) choose it.

The paper trains a network to a MAP solution, fits a diagonal Laplace approximation of every
weight there, keeps the ``S`` weights of largest marginal variance, and infers a full
covariance over those only, the rest staying at the MAP. :func:`subnetwork_guide` does the
first three (the MAP fit, or one given; the diagonal Laplace and its ranking through
laplace-torch's ``LargestVarianceDiagLaplaceSubnetMask``) and returns the
:class:`guides.AutoSubnetwork` over the chosen weights, every mean starting at the MAP, for
``zoo.fit`` to learn the covariance by VI. ``zoo.laplace(options={"weights": "subnetwork"})``
makes the same choice and takes the Laplace covariance instead.
"""

from __future__ import annotations

import math

from typing_extensions import Unpack

from guides.families.subnetwork import DEFAULT_SIZE, AutoSubnetwork
from zoo.arguments import check_int, check_positive
from zoo.baselines.laplace_fitting import map_point, split_noise
from zoo.baselines.selection import subnetwork_indices
from zoo.data.forms import Data
from zoo.models.base import BayesianModel
from zoo.results.laplace_torch import (
    HELD_OUT_RULES,
    LaplaceOptions,
    check_laplace_model,
    import_laplace,
    site_names,
)
from zoo.results.variational import FitResult
from zoo.runtime.serial import one_at_a_time
from zoo.training.keywords import HowToFit, fit_arguments, refuses_flat_keywords


@refuses_flat_keywords
@one_at_a_time
def subnetwork_guide(
    model: BayesianModel,
    data: Data,
    size: int | None = None,
    *,
    at: FitResult | None = None,
    rank: int | None = None,
    init_scale: float = 0.01,
    prior_precision: str | float = "marglik",
    progress: bool = True,
    **how: Unpack[HowToFit],
) -> AutoSubnetwork:
    """The subnetwork guide of Daxberger et al.'s rule: the ``size`` weights of largest
    marginal variance under a diagonal Laplace at the MAP.

    Parameters
    ----------
    model
        A zoo model built on a plain network (what :func:`zoo.laplace` takes).
    data
        Training data (``(X, y)``, a Dataset or a DataLoader), held in memory.
    size : int, optional
        ``S``; by default :data:`guides.families.subnetwork.DEFAULT_SIZE`, or every weight of a
        smaller model.
    at : FitResult, optional
        The MAP fit (a ``"map"`` fit, or any fit whose guide's median is taken); by default
        ``zoo.fit(model, "map", data, ...)`` is run here with the fit arguments below.
    rank, init_scale
        The guide's (:class:`guides.AutoSubnetwork`): a full covariance, or diagonal plus
        rank ``rank``; the initial marginal standard deviation of the chosen weights.
    prior_precision : "marglik" or float, default "marglik"
        The diagonal Laplace's prior precision: fitted to its marginal likelihood, or fixed.
    progress : bool, default True
        The MAP fit's progress bar (unless ``run`` is given: then its ``progress``).
    **how : HowToFit
        The MAP fit's :func:`zoo.fit` arguments (:class:`zoo.training.keywords.HowToFit`;
        ``batch_size``, default 128, is also that of laplace-torch's pass over the data).

    Returns
    -------
    guides.AutoSubnetwork
        Over the chosen weights (``guide.masks``), every mean at the MAP; fit it with
        ``zoo.fit(model, guide, data)``.

    Notes
    -----
    A model laplace-torch cannot take, a missing laplace-torch, a ``size`` above the model's
    weights or above :data:`guides.joint_gaussian.FULL_MAX` (with ``rank=None``) are refused
    before any fit.
    """
    fit_args = fit_arguments(progress, how, "subnetwork_guide")
    if at is not None and not isinstance(at, FitResult):
        raise TypeError(f"at must be None or a FitResult (a MAP fit), got {at!r:.80}")
    total = sum(math.prod(model.site_shapes[n]) for n in site_names(model))
    size = min(DEFAULT_SIZE, total) if size is None else size
    check_int("size", size, 1, meaning="the weights in the Gaussian")
    if size > total:
        raise ValueError(
            f"size={size} is more than the model's {total} network weights: pass size <= {total}"
        )
    if isinstance(prior_precision, str) and prior_precision in HELD_OUT_RULES:
        raise ValueError(
            f"subnetwork_guide(prior_precision={prior_precision!r}): the diagonal Laplace "
            "that chooses the weights has no held-out data here; pass 'marglik' or a positive "
            "number"
        )
    options = LaplaceOptions(weights="subnetwork", hessian="full", subnetwork_size=size,
                             prior_precision=prior_precision)  # fmt: skip
    check_laplace_model(model, options)
    AutoSubnetwork(model, size, rank=rank, init_scale=init_scale)  # its own checks, no work
    batch_size = how.get("batch_size") or 128
    check_positive(batch_size=batch_size)
    import_laplace()
    weights, loader, _ = map_point(model, data, at, fit_args, batch_size)
    net_weights, noise = split_noise(weights)
    chosen = subnetwork_indices(model, net_weights, options, loader, noise)
    masks = site_masks(model, chosen)

    def at_map(site):
        return weights[site["name"]]  # map_point's weights are detached copies

    return AutoSubnetwork(model, None, masks, rank=rank, init_scale=init_scale, init_loc_fn=at_map)


def site_masks(model, positions) -> dict:
    """``{site: flat indices}`` of sorted positions in the vector of
    :func:`zoo.results.laplace_torch.site_names` (sites with none left out)."""
    masks, offset = {}, 0
    positions = positions.cpu()
    for name in site_names(model):
        count = math.prod(model.site_shapes[name])
        inside = positions[(positions >= offset) & (positions < offset + count)] - offset
        if inside.numel():
            masks[name] = inside
        offset += count
    return masks
