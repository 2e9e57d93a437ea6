"""Which weights a subnetwork holds, by Daxberger et al.'s rule (the largest marginal variances
of a diagonal Laplace at the MAP) or by magnitude: the choice both subnetwork producers make,
``zoo.subnetwork_guide`` (:mod:`zoo.baselines.subnetworks`) and ``zoo.laplace`` with
``weights="subnetwork"`` (:mod:`zoo.baselines.laplace_fitting`), through laplace-torch's
diagonal Laplace (:mod:`zoo.results.laplace_torch`)."""

from __future__ import annotations

import warnings

import torch

from zoo.results.laplace_torch import (
    PRIOR_RULES,
    LaplaceOptions,
    build,
    laplace_torch_call,
    site_names,
)

__all__ = ["diagonal_variances", "subnetwork_indices"]


def subnetwork_indices(
    model, weights: dict, options: LaplaceOptions, loader=None, sigma_noise=None
) -> torch.Tensor:
    """The ``options.subnetwork_size`` weights chosen by ``options.subnetwork_select``, as
    sorted positions in the vector of :func:`site_names`: the largest marginal variances of a
    diagonal Laplace of every weight at ``weights`` fitted on ``loader`` (``"variance"``), or
    the largest ``|weights|`` (``"magnitude"``). ``sigma_noise``: a regression's learned noise
    standard deviation at the MAP (a fixed one is the model's)."""
    size = options.subnetwork_size
    if options.subnetwork_select == "magnitude":
        flat = torch.cat([weights[n].detach().reshape(-1) for n in site_names(model)])
        scores = flat.abs()
    else:
        if loader is None:
            raise ValueError("the largest-variance subnetwork needs the training data (loader=)")
        scores = diagonal_variances(model, weights, options, loader, sigma_noise)
    chosen = torch.topk(scores, min(size, scores.numel())).indices
    return torch.sort(chosen).values.cpu()


def diagonal_variances(
    model, weights: dict, options: LaplaceOptions, loader, sigma_noise=None
) -> torch.Tensor:
    """Marginal posterior variances of every weight under a diagonal Laplace at ``weights``
    (the scores of laplace-torch's ``LargestVarianceDiagLaplaceSubnetMask``), flat in
    :func:`site_names` order; the prior precision is the fixed ``options.prior_precision``, or
    fitted to the diagonal Laplace's marginal likelihood (also for ``"gridsearch"``, whose
    held-out data score the subnetwork's Laplace, not this one). The curvature is ASDL's
    diagonal GGN (per example, little memory), or laplace-torch's default backend for a network
    with layers ASDL does not cover (attention)."""
    precision = options.prior_precision
    if precision in PRIOR_RULES:
        precision = "marglik"
    diagonal = LaplaceOptions(weights="all", hessian="diag", prior_precision=precision)
    try:
        return _diagonal_variances(build(model, weights, diagonal), diagonal, loader, sigma_noise)
    except ValueError as err:  # ASDL's diagonal GGN covers standard layers only (no attention)
        if "ASDL" not in str(err):
            raise
    from laplace.curvature import CurvlinopsGGN  # laplace-torch's default: any module, more memory

    la = build(model, weights, diagonal, backend=CurvlinopsGGN)
    return _diagonal_variances(la, diagonal, loader, sigma_noise)


def _diagonal_variances(la, diagonal: LaplaceOptions, loader, sigma_noise) -> torch.Tensor:
    """:func:`diagonal_variances` on laplace-torch's diagonal Laplace ``la`` (not fitted), built
    with ``diagonal``: one pass over ``loader``, its precision fitted where ``diagonal`` says
    ``"marglik"``, then its ``posterior_variance``, which is what
    ``LargestVarianceDiagLaplaceSubnetMask.compute_param_scores`` returns after fitting ``la``
    again (that second pass would give the same curvature)."""
    if sigma_noise is not None:
        la.sigma_noise = sigma_noise
    with laplace_torch_call("the subnetwork's diagonal Laplace"), warnings.catch_warnings():
        # laplace-torch's note on link_approx, which the marginal likelihood does not use
        warnings.filterwarnings("ignore", "By default `link_approx`", UserWarning)
        la.fit(loader)
        if diagonal.prior_precision == "marglik":  # also the caller's gridsearch
            la.optimize_prior_precision(pred_type="glm", method="marglik")
        return la.posterior_variance.detach()
