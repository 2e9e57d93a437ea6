"""The bridge to ArviZ. Every ArviZ call of the package is in this module, which works with the
ArviZ that is installed: 0.23 (``az.InferenceData``, Python 3.10 and 3.11) or 1.x (the
``arviz-base``, ``arviz-stats`` and ``arviz-plots`` packages, where a posterior is an
``xarray.DataTree``; Python 3.12 and later). :meth:`zoo.Posterior.to_arviz` returns that
ArviZ's own form, and every function here takes it; the numbers are the same under both (PSIS-LOO,
R-hat and ESS are the same estimators). :data:`ARVIZ_1` says which one runs.

What the diagnostics mean for variational draws
-----------------------------------------------
Draws from a fitted guide are independent by construction, so the effective sample size of any
quantity is about the number of draws ``S`` and autocorrelation is zero. ``r_hat`` needs several
chains: with one guide it is undefined, and splitting one guide's draws into pseudo-chains makes
it about 1 by construction, which says nothing. Independent fits from different seeds can serve
as chains for identifiable quantities (predictions, not raw weights, which hidden-unit
permutations scramble). ``az.loo`` on BNNs often reports many Pareto ``k > 0.7``: report the
held-out log predictive density next to it.

Speed: ``az.summary`` with the default ``kind="all"`` computes ESS and r_hat for every weight
(minutes at 100k weights); pass ``kind="stats"`` and/or ``var_names`` for large models.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from zoo.evaluation.plots import class_ppc

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

#: Whether the installed ArviZ is 1.x (``DataTree``) rather than 0.23 (``InferenceData``).
ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1
#: The module for the calls only one of the two versions has (typed loosely: the checker sees
#: the installed version's names only).
_versioned: Any = az

_DIM_SUFFIXES = {1: ("out",), 2: ("out", "in"), 3: ("out", "in", "k"), 4: ("out", "in", "kh", "kw")}


def site_dims(name: str, shape: Sequence[int]) -> list[str]:
    """Named dims of a weight site: ``fc1.weight`` (out, in) -> ``["fc1_out", "fc1_in"]``."""
    layer = name.rsplit(".", 1)[0].replace(".", "_") if "." in name else name
    suffixes = _DIM_SUFFIXES.get(len(shape), tuple(f"dim{i}" for i in range(len(shape))))
    return [f"{layer}_{s}" for s in suffixes]


def from_groups(groups: dict, dims: dict, attrs: dict) -> az.InferenceData:
    """``az.from_dict`` of ``groups`` (``{group: {name: (chain, draw, ...) array}}``) with
    named ``dims`` and ``attrs`` (what :meth:`zoo.Posterior.to_arviz` assembles)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        # ArviZ's guess that an array is transposed: an ensemble of K point masses is meant
        # to hold K chains of one draw
        warnings.filterwarnings("ignore", "More chains .* than draws", UserWarning)
        warnings.filterwarnings("ignore", "Found chain dimension to be longer", UserWarning)
        if ARVIZ_1:  # attrs by group there: the tree's own (as 0.23's), and the posterior's
            tree = az.from_dict(groups, dims=dims, attrs={"posterior": attrs})
            tree.attrs.update(attrs)
            return tree
        return az.from_dict(**groups, dims=dims, attrs=attrs)


def groups_of(idata) -> set[str]:
    """The group names of ``idata`` (``"posterior"``, ...), under either ArviZ."""
    if ARVIZ_1:
        return set(idata.children)
    return set(idata.groups())


def add_data_groups(groups: dict, dims: dict, log_lik, replicated, y) -> None:
    """``log_likelihood``, ``posterior_predictive`` and ``observed_data`` of ``obs``; the
    first two are ``(chain, draw, N, ...)`` arrays."""
    groups["log_likelihood"] = {"obs": log_lik}
    groups["posterior_predictive"] = {"obs": replicated}
    groups["observed_data"] = {"obs": y.cpu().numpy()}
    dims["obs"] = ["obs_id"] + [f"obs_dim_{i}" for i in range(1, y.dim())]


def chain_diagnostics(quantities: dict) -> dict[str, float]:
    """For each ``(C, D, ...)`` array of ``quantities``: ``<name>_r_hat``, the largest rank-
    normalised split R-hat over its elements, and ``<name>_ess_bulk``, the smallest bulk ESS
    (Vehtari et al. 2021, as ``az.rhat`` and ``az.ess`` compute them; R-hat below 1.01 and
    ESS above 100 per chain are the usual bars)."""
    arrays = {
        name: np.asarray(value.cpu() if hasattr(value, "cpu") else value)
        for name, value in quantities.items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dataset = az.convert_to_dataset(arrays)
        rhat, ess = az.rhat(dataset), az.ess(dataset, method="bulk")
    out = {}
    for name in arrays:
        out[f"{name}_r_hat"] = float(np.nanmax(rhat[name].values))
        out[f"{name}_ess_bulk"] = float(np.nanmin(ess[name].values))
    return out


def summary(
    idata: az.InferenceData,
    var_names=None,
    kind: Literal["all", "stats", "diagnostics"] = "stats",
    **kwargs,
):
    """``az.summary`` with ``kind="stats"`` by default (fast for large models)."""
    return az.summary(idata, var_names=var_names, kind=kind, **kwargs)


def layer_summary(idata: az.InferenceData):
    """One row per posterior variable: size, mean of the posterior means, mean posterior sd,
    mean ``|mean| / sd`` (signal to noise). Fast at any size."""
    rows = []
    for name, da in idata["posterior"].data_vars.items():
        values = np.asarray(da).reshape(da.shape[0] * da.shape[1], -1)
        mean, sd = values.mean(0), values.std(0)
        rows.append(
            {
                "variable": name,
                "size": mean.size,
                "mean": float(mean.mean()),
                "sd": float(sd.mean()),
                "snr": float(np.mean(np.abs(mean) / np.maximum(sd, 1e-12))),
            }
        )
    return pd.DataFrame(rows).set_index("variable")


#: The fewest draws PSIS-LOO takes: Pareto smoothing fits the largest ``min(S / 5, 3 sqrt(S))``
#: importance ratios, at least 5 of them (ArviZ 1.x refuses fewer; 0.23 warned).
LOO_MIN_DRAWS = 25


def loo(idata: az.InferenceData, **kwargs):
    """PSIS-LOO (``reff=1`` for independent variational draws, which also skips an ESS pass
    over every weight); at least :data:`LOO_MIN_DRAWS` draws in all."""
    sizes = idata["log_likelihood"].sizes
    draws = sizes["chain"] * sizes["draw"]
    if draws < LOO_MIN_DRAWS:
        raise ValueError(
            f"PSIS-LOO needs at least {LOO_MIN_DRAWS} draws (its Pareto fit takes the largest "
            f"fifth of the importance ratios, at least 5), got {draws}: pass num_samples="
            f"{LOO_MIN_DRAWS} or more to to_arviz"
        )
    kwargs.setdefault("reff", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return az.loo(idata, **kwargs)


def elpd(result) -> tuple[float, float]:
    """``(elpd, se)`` of a :func:`loo` result, under either ArviZ (``elpd_loo`` in 0.23,
    ``elpd`` in 1.x)."""
    value = result.elpd if ARVIZ_1 else result.elpd_loo
    return float(value), float(result.se)


def plot_ppc(idata: az.InferenceData, **kwargs):
    """Posterior predictive check of the observations; returns the matplotlib Figure.

    Real-valued observations: ``az.plot_ppc`` (``kwargs`` go to it). Class labels (integer
    observations): one bar per class, the observed count beside the replicated counts' median
    with their central 90% over the draws (:func:`zoo.plots.class_ppc`), since ArviZ's
    histograms choose bin widths that can merge neighbouring classes."""
    observed = idata["observed_data"]["obs"].values
    if observed.dtype.kind in "iub":
        replicated = idata["posterior_predictive"]["obs"].values
        return class_ppc(observed.ravel(), replicated.reshape(-1, observed.size), **kwargs)
    draws = idata["posterior_predictive"].sizes["draw"]
    if ARVIZ_1:  # arviz-plots' predictive check, on matplotlib
        kwargs.setdefault("num_samples", min(50, draws))
        collection = _versioned.plot_ppc_dist(idata, backend="matplotlib", **kwargs)
        return _detached(collection.viz["figure"].item())
    kwargs.setdefault("num_pp_samples", min(50, draws))
    ax = _versioned.plot_ppc(idata, **kwargs)
    ax = np.ravel(ax)[0] if isinstance(ax, np.ndarray) else ax
    return _detached(ax.figure)


def plot_posterior(idata: az.InferenceData, var_names, coords=None, **kwargs):
    """The marginal posterior of chosen weights (``az.plot_posterior``; ``az.plot_dist`` under
    ArviZ 1.x); returns the Figure."""
    if ARVIZ_1:
        collection = az.plot_dist(idata, var_names=var_names, coords=coords,
                                  backend="matplotlib", **kwargs)  # fmt: skip
        return _detached(collection.viz["figure"].item())
    axes = _versioned.plot_posterior(idata, var_names=var_names, coords=coords, **kwargs)
    return _detached(np.ravel(axes)[0].figure)


def to_netcdf(idata: az.InferenceData, path) -> str:
    """Write ``idata`` (either ArviZ's form) to a netCDF file; returns the path."""
    idata.to_netcdf(str(path))
    return str(path)


def from_netcdf(path) -> az.InferenceData:
    """Read what :func:`to_netcdf` wrote, in the installed ArviZ's form."""
    return az.from_netcdf(str(path))


def _detached(fig):
    """ArviZ draws through pyplot: take the figure out of pyplot's registry, so that a notebook
    shows the returned figure once (not again when the cell ends) and nothing stays open."""
    plt.close(fig)
    return fig


def select_sites(names: list[str], var_names) -> list[str]:
    """The ``names`` that ``var_names`` keeps (names or regular expressions; all for
    ``None``), refusing a selection that matches none."""
    if var_names is None:
        return names
    patterns = [var_names] if isinstance(var_names, str) else list(var_names)
    keep = [n for n in names if any(n == p or re.fullmatch(p, n) for p in patterns)]
    if not keep:
        raise ValueError(f"var_names {patterns} match no site; sites are {names}")
    return keep
