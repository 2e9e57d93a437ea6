"""The Laplace approximation's prior precision chosen on held-out data
(``LaplaceOptions(prior_precision="gridsearch")``).

The marginal likelihood, ``zoo.laplace``'s default, reads the prior precision ``P`` off the
training data alone. Where the MAP network interpolates its training data the curvature ``H``
of the likelihood is near zero, the evidence then favours a broad prior, and the predictive of
``N(w*, (H + P)^-1)`` can be wider than the MAP network's own (``benchmarks/laplace_prior.py`` at
``a4a7b8f``).
The grid search scores each precision by the negative log predictive density of held-out data
under the fit's *own* predictive (its ``predictive`` option, its number of draws, draws seeded
alike at every precision so the curve is smooth), and keeps the lowest: the recipe of Immer et
al.'s and Daxberger et al.'s cross-validated baselines, scored as ``Posterior.evaluate`` scores,
not by laplace-torch's probit default or a regression's squared error, which does not depend on
``P`` under the GLM predictive.

The grid is :data:`COARSE` (one precision per decade, ``1e-4`` to ``1e4``), then
:data:`FINE` around the coarse best: fifteen predictions of the held-out data, a resolution of
a quarter decade. A precision at which laplace-torch's linear algebra fails scores ``inf``.
"""

from __future__ import annotations

import math
import warnings

import torch

from zoo.results.laplace_torch import LaplaceTorchError

__all__ = [
    "COARSE",
    "FINE",
    "HELD_OUT_SHARE",
    "MIN_HELD_OUT",
    "held_out_precision",
    "held_out_split",
]

#: log10 of the first grid's precisions: one a decade.
COARSE = tuple(float(k) for k in range(-4, 5))
#: Decades around the coarse grid's best that the second grid adds.
FINE = (-0.75, -0.5, -0.25, 0.25, 0.5, 0.75)
#: The share of ``data`` that ``prior_precision="auto"`` holds out when no validation is given.
HELD_OUT_SHARE = 0.1
#: Fewer held-out rows than this score too noisily: ``"auto"`` takes the marginal likelihood.
MIN_HELD_OUT = 20


def held_out_split(n: int, seed: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(kept, held)``: sorted row indices of ``n`` rows, ``held`` a random
    :data:`HELD_OUT_SHARE` of them (rounded) drawn from ``seed`` (0 when ``None``) by a
    generator of its own, the global one untouched; ``None`` where ``held`` would hold fewer
    than :data:`MIN_HELD_OUT` rows."""
    size = round(HELD_OUT_SHARE * n)
    if size < MIN_HELD_OUT:
        return None
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed or 0))
    return order[size:].sort().values, order[:size].sort().values


def held_out_precision(
    fit, x: torch.Tensor, y: torch.Tensor, options, warn_top: bool = True
) -> dict:
    """Set ``fit.laplace``'s prior precision to the grid's best on held-out ``(x, y)`` and
    return the search: ``{"precisions": [...], "nll": [...]}`` in the order scored.

    Parameters
    ----------
    fit : LaplaceFit
        A fitted Laplace approximation (its curvature computed); its ``prior_precision`` is
        changed in place.
    x, y : torch.Tensor
        Held-out inputs and targets, checked against the model by the caller.
    options : PredictOptions
        How each precision's predictive is drawn (``seed`` fixed, the same at every
        precision).
    warn_top : bool, default True
        Warn at the grid's top edge too. ``prior_precision="auto"`` does not: there the
        predictive is the MAP network's own to within its draws (the data favour no spread), a
        safe answer it records as ``"at_edge"``.

    Warns
    -----
    UserWarning
        When the best precision is at the grid's edge (``1e-4`` or ``1e4``): a better one may
        lie outside it.
    """
    scored: dict[float, float] = {}

    def score(log10: float) -> None:
        if log10 not in scored:
            scored[log10] = _held_out_nll(fit, 10.0**log10, x, y, options)

    for log10 in COARSE:
        score(log10)
    best = min(scored, key=scored.__getitem__)
    for step in FINE:
        if COARSE[0] <= best + step <= COARSE[-1]:
            score(best + step)
    best = min(scored, key=scored.__getitem__)
    if not math.isfinite(scored[best]):
        raise LaplaceTorchError(
            "zoo.laplace's prior precision: the held-out predictive failed at every precision "
            f"from 1e{COARSE[0]:g} to 1e{COARSE[-1]:g}; refit the MAP weights or use "
            "prior_precision='marglik'"
        )
    edges = (COARSE[0], COARSE[-1]) if warn_top else (COARSE[0],)
    if best in edges:
        warnings.warn(
            f"zoo.laplace: the held-out NLL is lowest at the grid's edge (prior precision "
            f"1e{best:g}); a better precision may lie beyond it: give a fixed prior_precision "
            "beyond the edge and compare",
            UserWarning,
            stacklevel=5,  # zoo.laplace's caller, past its two decorators
        )
    _set(fit, 10.0**best)
    return {
        "precisions": [10.0**k for k in scored],
        "nll": list(scored.values()),
        "at_edge": best in (COARSE[0], COARSE[-1]),
    }


def _held_out_nll(fit, precision: float, x, y, options) -> float:
    """The held-out NLL of ``fit``'s predictive at ``precision`` (``inf`` where laplace-torch's
    linear algebra fails or the predictive is not finite)."""
    _set(fit, precision)
    try:
        value = fit.summarise(x, y, options).metrics()["nll"]
    except LaplaceTorchError:
        return math.inf
    return value if math.isfinite(value) else math.inf


def _set(fit, precision: float) -> None:
    """laplace-torch's scalar prior precision (its posterior reads it on the next use)."""
    current = fit.laplace.prior_precision
    fit.laplace.prior_precision = torch.tensor(
        precision, dtype=current.dtype, device=current.device
    )
