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
    from zoo.runtime.arguments import check_positive, check_seed

    check_positive(num_samples=num_samples)
    check_seed(seed)
    xy = _labelled(fit.model, data, fit.device)
    draws, log_lik, replicated = _fit_draws(
        fit, xy, num_samples, seed, progress, distributed, threads
    )
    keep = _select(list(draws), var_names)
    posterior = {name: draws[name].cpu().numpy()[None] for name in keep}
    dims = {name: site_dims(name, draws[name].shape[1:]) for name in keep}
    groups = {"posterior": posterior}
    if xy is not None:
        _add_data_groups(groups, dims, log_lik[None], replicated[None], xy[1])
    attrs = {
        "guide": type(fit.guide).__name__,
        "steps": fit.steps,
        "final_elbo": -fit.losses[-1] if fit.losses else float("nan"),
        "inference_library": "pyro + bnn-zoo",
    }
    return _from_dict(groups, dims, attrs)


@one_at_a_time
def ensemble_inference_data(
    ens,
    data=None,
    num_samples: int = 200,
    var_names: Sequence[str] | str | None = None,
    seed: int | None = 0,
    progress: bool = True,
    threads: int | str | None = "auto",
) -> az.InferenceData:
    """An ``az.InferenceData`` of a :class:`~zoo.baselines.ensembles.Ensemble` whose members
    are its chains: ``posterior`` of dims ``(chain, draw, ...)``, ``K`` chains of
    ``m = ens.draws_per_member(num_samples)`` draws (one for point masses), member ``k``'s
    drawn as :func:`to_inference_data` draws a fit's, with the seed ``seed + k``; with
    ``data = (X, y)`` the same data groups, one entry per draw of every member.

    Independent members make ``az.summary``'s R-hat compare the members with one another:
    on predictions (not raw weights, which hidden-unit permutations scramble) a large R-hat
    says the members disagree more than one member's draws vary. With one draw per member
    (MAP members) ArviZ cannot estimate R-hat or ESS and reports ``nan``.
    """
    from zoo.runtime.arguments import check_positive, check_seed

    check_positive(num_samples=num_samples)
    check_seed(seed)
    xy = _labelled(ens.model, data, ens.device)
    per = ens.draws_per_member(num_samples)
    parts = [
        _fit_draws(m, xy, per, None if seed is None else seed + k, progress, False, threads)
        for k, m in enumerate(ens.members)
    ]
    draws = {name: np.stack([p[0][name].cpu().numpy() for p in parts]) for name in parts[0][0]}
    keep = _select(list(draws), var_names)
    dims = {name: site_dims(name, draws[name].shape[2:]) for name in keep}
    groups = {"posterior": {name: draws[name] for name in keep}}
    if xy is not None:
        log_lik, replicated = (np.stack([p[i] for p in parts]) for i in (1, 2))
        _add_data_groups(groups, dims, log_lik, replicated, xy[1])
    family = ens.members[0].options.get("guide")
    attrs = {
        "inference": f"deep ensemble of {len(ens.members)} {family} fits",
        "inference_library": "pyro + bnn-zoo",
    }
    return _from_dict(groups, dims, attrs)


@one_at_a_time
def laplace_inference_data(
    fit,
    data=None,
    num_samples: int = 200,
    var_names: Sequence[str] | str | None = None,
    seed: int | None = 0,
    progress: bool = True,
) -> az.InferenceData:
    """An ``az.InferenceData`` of a :class:`~zoo.baselines.laplace_fit.LaplaceFit`:
    ``posterior``, one chain of ``num_samples`` joint draws of the weights from the Laplace
    Gaussian (:meth:`~zoo.baselines.laplace_fit.LaplaceFit.sample`; the sites it does not
    cover at their MAP values, constant draws); with ``data = (X, y)`` the data groups of those
    draws (:meth:`~zoo.baselines.laplace_fit.LaplaceFit.predict_at`: the sampled networks,
    or the network linearised at the MAP weights for the GLM and probit predictives of all
    weights). ``seed`` fixes the weight draws and the replicated ``y``; ``progress`` is
    accepted for the other conversions' signature."""
    from zoo.runtime.rng import seeded

    draws = fit.sample(num_samples, seed)
    xy = _labelled(fit.model, data, fit.device)
    keep = _select(list(draws), var_names)
    posterior = {name: draws[name].cpu().numpy()[None] for name in keep}
    dims = {name: site_dims(name, draws[name].shape[1:]) for name in keep}
    groups = {"posterior": posterior}
    if xy is not None:
        x, y = xy
        pred = fit.predict_at(x.to(fit.device), draws)
        y = y.to(pred.outputs.device)
        log_lik = pred.log_likelihood(y).cpu().numpy()
        with seeded(seed, pred.outputs.device):
            replicated = pred.likelihood.sample().cpu().numpy()
        _add_data_groups(groups, dims, log_lik[None], replicated[None], y)
    options = fit.options
    attrs = {
        "inference": f"Laplace ({options.weights}, {options.hessian} Hessian, "
        f"{options.predictive} predictive; laplace-torch)",
        "inference_library": "laplace-torch + bnn-zoo",
    }
    return _from_dict(groups, dims, attrs)


def _labelled(model, data, device):
    """``(X, y)`` of ``data`` checked against ``model``, or ``None`` without data."""
    if data is None:
        return None
    from zoo.data.checks import check_labelled_data, gather_tensors

    x, y = gather_tensors(data)
    check_labelled_data(model, x, y, device)
    return x, y


def _fit_draws(fit, xy, num_samples, seed, progress, distributed, threads):
    """``num_samples`` draws of ``fit``'s guide and, with ``xy``, their log-likelihoods and
    one replicated ``y`` each (numpy), all from one stream seeded ``seed``."""
    from zoo.evaluation.predictive import predict
    from zoo.runtime.rng import seeded

    log_lik = replicated = None
    with seeded(seed, fit.device):  # one stream: the draws, then the replicated data
        draws = fit.guide.sample_posterior(num_samples)
        if xy is not None:
            x, y = xy
            pred = predict(fit.model, fit.guide, x, params=draws, progress=progress,
                           distributed=distributed, threads=threads)  # fmt: skip
            log_lik = pred.log_likelihood(y.to(pred.outputs.device)).cpu().numpy()
            replicated = pred.likelihood.sample().cpu().numpy()
    return draws, log_lik, replicated


def _from_dict(groups: dict, dims: dict, attrs: dict) -> az.InferenceData:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        # ArviZ's guess that an array is transposed: an ensemble of K point masses is meant
        # to hold K chains of one draw
        warnings.filterwarnings("ignore", "More chains .* than draws", UserWarning)
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
    return _from_dict(groups, dims, attrs)


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
