"""The bridge to ArviZ. Every ArviZ call of the package is in this module, so a move from ArviZ
0.23 (``InferenceData``) to 1.x (``xarray.DataTree``) stays local.

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

import numpy as np

from zoo.runtime.serial import one_at_a_time

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

_DIM_SUFFIXES = {1: ("out",), 2: ("out", "in"), 3: ("out", "in", "k"), 4: ("out", "in", "kh", "kw")}


def site_dims(name: str, shape: Sequence[int]) -> list[str]:
    """Named dims of a weight site: ``fc1.weight`` (out, in) -> ``["fc1_out", "fc1_in"]``."""
    layer = name.rsplit(".", 1)[0].replace(".", "_") if "." in name else name
    suffixes = _DIM_SUFFIXES.get(len(shape), tuple(f"dim{i}" for i in range(len(shape))))
    return [f"{layer}_{s}" for s in suffixes]


@one_at_a_time
def to_inference_data(
    fit,
    data=None,
    num_samples: int = 200,
    var_names: Sequence[str] | str | None = None,
    seed: int | None = 0,
    progress: bool = True,
    distributed: bool = False,
    threads: int | str | None = "auto",
) -> az.InferenceData:
    """An ``az.InferenceData`` of a fitted guide.

    Groups: ``posterior`` (``num_samples`` draws of every latent site as one chain, with named
    dims per layer such as ``fc1_out``, ``fc1_in``); with ``data = (X, y)`` also
    ``posterior_predictive`` (``obs``: one replicated ``y`` per draw), ``log_likelihood``
    (``obs``: ``log p(y_n | x_n, w_s)``) and ``observed_data``. ``attrs`` name the guide
    family, the number of steps and the final ELBO.

    Parameters
    ----------
    fit : zoo.FitResult
    data : (X, y), Dataset or DataLoader, optional
    num_samples : int
        Posterior draws ``S``.
    var_names : str or list of str, optional
        Sites kept in ``posterior``: names or regular expressions (all by default). Use it to
        keep files and summaries of large models small; predictions always use every site.
    seed : int or None
        Seeds the draws.
    progress : bool
        Progress bar of the predictions (shown after two seconds).
    distributed : bool
        Called on every rank of a distributed run: the predictions are computed in shards and
        gathered once (:func:`zoo.evaluation.predictive.predict`); every rank returns the same
        groups.
    threads : "auto", int or None
        CPU threads of the predictions, as ``zoo.fit``'s (:mod:`zoo.runtime.threads`).
    """
    from zoo.data.checks import check_labelled_data, gather_tensors
    from zoo.evaluation.predictive import predict
    from zoo.runtime.arguments import check_positive, check_seed
    from zoo.runtime.rng import seeded

    check_positive(num_samples=num_samples)
    check_seed(seed)
    guide, model = fit.guide, fit.model
    if data is not None:
        x, y = gather_tensors(data)
        check_labelled_data(model, x, y, fit.device)
    with seeded(seed, fit.device):  # one stream: the draws, then the replicated data
        draws = guide.sample_posterior(num_samples)
        if data is not None:
            pred = predict(
                model,
                guide,
                x,
                params=draws,
                progress=progress,
                distributed=distributed,
                threads=threads,
            )
            y = y.to(pred.outputs.device)
            log_lik = pred.log_likelihood(y).cpu().numpy()
            replicated = pred.likelihood.sample().cpu().numpy()
    keep = _select(list(draws), var_names)
    posterior = {name: draws[name].cpu().numpy()[None] for name in keep}
    dims = {name: site_dims(name, draws[name].shape[1:]) for name in keep}
    groups = {"posterior": posterior}
    if data is not None:
        _add_data_groups(groups, dims, log_lik[None], replicated[None], y)
    attrs = {
        "guide": type(guide).__name__,
        "steps": fit.steps,
        "final_elbo": -fit.losses[-1] if fit.losses else float("nan"),
        "inference_library": "pyro + bnn-zoo",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return az.from_dict(**groups, dims=dims, attrs=attrs)


def reference_inference_data(
    ref, data=None, var_names=None, seed: int | None = 0, progress: bool = True
) -> az.InferenceData:
    """An ``az.InferenceData`` of a :class:`~zoo.mcmc.result.Reference`: ``posterior``
    with dims ``(chain, draw, ...)`` (so ``az.summary`` gives R-hat and ESS), ``sample_stats``
    (``diverging`` as booleans, ``tree_depth``, ``step_size``, ``energy``, ``lp``,
    ``acceptance_rate``), and with ``data = (X, y)`` the groups :func:`to_inference_data` adds,
    one entry per draw of every chain (``seed`` fixes the replicated ``y``)."""
    from zoo.data.checks import check_labelled_data, gather_tensors
    from zoo.runtime.rng import seeded

    c, d = ref.shape
    keep = _select(list(ref.draws), var_names)
    posterior = {name: ref.draws[name].cpu().numpy() for name in keep}
    dims = {name: site_dims(name, ref.draws[name].shape[2:]) for name in keep}
    stats = {name: value.cpu().numpy() for name, value in ref.stats.items()}
    stats["diverging"] = stats["diverging"].astype(bool)
    stats["tree_depth"] = stats["tree_depth"].astype(np.int64)
    groups = {"posterior": posterior, "sample_stats": stats}
    if data is not None:
        x, y = gather_tensors(data)
        check_labelled_data(ref.model, x, y, ref.device)
        pred = ref.predict(x, progress=progress)
        y = y.to(pred.outputs.device)
        log_lik = pred.log_likelihood(y).cpu().numpy()
        with seeded(seed, pred.outputs.device):
            replicated = pred.likelihood.sample().cpu().numpy()
        per_chain = lambda a: a.reshape(c, d, *a.shape[1:])  # noqa: E731
        _add_data_groups(groups, dims, per_chain(log_lik), per_chain(replicated), y)
    attrs = {"inference": "NUTS (pyro.infer.mcmc)", "inference_library": "pyro + bnn-zoo"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return az.from_dict(**groups, dims=dims, attrs=attrs)


def _add_data_groups(groups: dict, dims: dict, log_lik, replicated, y) -> None:
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


def summary(idata: az.InferenceData, var_names=None, kind: str = "stats", **kwargs):
    """``az.summary`` with ``kind="stats"`` by default (fast for large models)."""
    return az.summary(idata, var_names=var_names, kind=kind, **kwargs)


def layer_summary(idata: az.InferenceData):
    """One row per posterior variable: size, mean of the posterior means, mean posterior sd,
    mean ``|mean| / sd`` (signal to noise). Fast at any size."""
    import pandas as pd

    rows = []
    for name, da in idata.posterior.data_vars.items():
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


def loo(idata: az.InferenceData, **kwargs):
    """PSIS-LOO (``reff=1`` for independent variational draws, which also skips an ESS pass
    over every weight)."""
    kwargs.setdefault("reff", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return az.loo(idata, **kwargs)


def plot_ppc(idata: az.InferenceData, **kwargs):
    """Posterior predictive check of the observations; returns the matplotlib Figure.

    Real-valued observations: ``az.plot_ppc`` (``kwargs`` go to it). Class labels (integer
    observations): one bar per class, the observed count beside the replicated counts' median
    with their central 90% over the draws (:func:`zoo.plots.class_ppc`), since ArviZ's
    histograms choose bin widths that can merge neighbouring classes."""
    observed = idata.observed_data["obs"].values
    if observed.dtype.kind in "iub":
        from zoo.plots import class_ppc

        replicated = idata.posterior_predictive["obs"].values
        return class_ppc(observed.ravel(), replicated.reshape(-1, observed.size), **kwargs)
    kwargs.setdefault("num_pp_samples", min(50, idata.posterior_predictive.sizes["draw"]))
    ax = az.plot_ppc(idata, **kwargs)
    ax = np.ravel(ax)[0] if isinstance(ax, np.ndarray) else ax
    return _detached(ax.figure)


def plot_posterior(idata: az.InferenceData, var_names, coords=None, **kwargs):
    """``az.plot_posterior`` of chosen weights; returns the Figure."""
    axes = az.plot_posterior(idata, var_names=var_names, coords=coords, **kwargs)
    return _detached(np.ravel(axes)[0].figure)


def to_netcdf(idata: az.InferenceData, path) -> str:
    """Write the InferenceData to a netCDF file."""
    return idata.to_netcdf(str(path))


def from_netcdf(path) -> az.InferenceData:
    """Read an InferenceData written by :func:`to_netcdf`."""
    return az.from_netcdf(str(path))


def _detached(fig):
    """ArviZ draws through pyplot: take the figure out of pyplot's registry, so that a notebook
    shows the returned figure once (not again when the cell ends) and nothing stays open."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


def _select(names: list[str], var_names) -> list[str]:
    if var_names is None:
        return names
    patterns = [var_names] if isinstance(var_names, str) else list(var_names)
    keep = [n for n in names if any(n == p or re.fullmatch(p, n) for p in patterns)]
    if not keep:
        raise ValueError(f"var_names {patterns} match no site; sites are {names}")
    return keep
