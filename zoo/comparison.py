"""Fit several posterior families on the same model and data, and tabulate them."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence

from tqdm import tqdm

from zoo.baselines.ensembles import check_ensemble, ensemble
from zoo.baselines.laplace_fit import laplace
from zoo.baselines.laplace_torch import LaplaceOptions
from zoo.data.checks import check_labelled_data, gather_tensors
from zoo.evaluation.agreement import distances
from zoo.runtime.arguments import check_model_factory
from zoo.runtime.serial import one_at_a_time
from zoo.training.options import Engine, group, grouped


@one_at_a_time
def compare(
    model_factory: Callable,
    guides: Sequence | None = None,
    train=None,
    test=None,
    *,
    num_samples: int = 100,
    chart: str | os.PathLike | None = None,
    return_fits: bool = False,
    progress: bool = True,
    reference=None,
    **fit_options,
):
    """Fit each family with the same data, seed and options; one row per family.

    Parameters
    ----------
    model_factory : callable
        ``() -> model``; called once per family so that no fit sees another's state.
    guides : sequence, optional
        Family names, ``(label, family, guide_options)`` triples, e.g.
        ``("lowrank r=2", "lowrank", {"rank": 2})``, or ``(label, family, guide_options,
        fit_options)`` for options of that row's ``zoo.fit`` only (they override
        ``**fit_options``), e.g. ``("MC dropout", "mc_dropout", {"p": 0.1},
        {"estimator": "local"})``. Default: every registered family (``guides.available()``).
        A deep ensemble is a row too: ``("5 MAP nets", "ensemble", {"members": 5, "family":
        "map"})`` fits :func:`zoo.ensemble` (its ``parameters`` and ``fit_seconds`` are all
        members' together, its ``final_elbo`` is NaN: an ensemble has no ELBO). So is the
        Laplace approximation (laplace-torch installed): ``("Laplace, last-layer KFAC",
        "laplace", {"weights": "last_layer", "hessian": "kron"})`` takes
        :class:`zoo.LaplaceOptions`' fields and runs :func:`zoo.laplace` (a MAP fit with the
        row's fit options, then laplace-torch); its ``parameters`` are the MAP weights and the
        curvature's numbers.
    train, test
        Training and held-out data (``(X, y)``, a Dataset or a DataLoader).
    num_samples : int
        Posterior samples per test input.
    chart : path, optional
        Where to save a bar chart of the test metrics (PNG, PDF, ...).
    return_fits : bool
        Also return ``{label: FitResult}``.
    reference : zoo.Reference, optional
        An HMC reference of the same model and training data (:func:`zoo.reference`): each
        row also gets its distances to it on ``test`` (:func:`zoo.evaluation.agreement.distances`:
        ``agreement`` and ``total_variation``, or ``w2``, ``sd_ratio`` and
        ``reference_coverage``), and the reference gets its own last row (``"HMC reference"``,
        its sampling time as ``fit_seconds``, its distances to itself).
    progress : bool
        A line per family as its fit starts, and the fit's and evaluation's progress bars.
    **fit_options
        Passed to every ``zoo.fit`` call (``epochs``, ``lr``, ``seed``, the option groups
        ``optim``, ``loss``, ``engine``, ``run``, or the groups' fields flat, as a row's own
        options are: :func:`zoo.training.options.grouped`); the engine's ``threads`` also sets the
        evaluations' CPU threads (``zoo.fit``'s rule by default). A ``run`` group replaces
        ``progress``'s for the fits.

    Returns
    -------
    pandas.DataFrame
        Indexed by family label: ``parameters`` (variational), ``fit_seconds``,
        ``steps_per_second``, ``final_elbo`` (mean ``ELBO`` of the last epoch, full-data
        scale), then the test metrics of :meth:`zoo.FitResult.evaluate`, then the distances
        to ``reference`` when one is given. ``final_elbo``
        compares Gaussian families only: MC dropout's contains ``-n log sigma`` (its ``q`` is
        nearly degenerate) and a point mass's is a log joint density (no entropy); compare the
        test metrics across those.
    """
    from guides import family as guide_family
    from zoo.training.fitting import fit as run_fit

    if train is None or test is None:
        raise ValueError("compare needs both train and test data")
    check_model_factory(model_factory, "compare")
    if guides is None:
        from guides import available

        guides = available()
    guides = list(guides)
    if not guides:
        raise ValueError("guides is empty: name at least one family (guides.available())")
    for spec in guides:
        check_row(spec)  # a malformed entry fails now, not after the fits before it
    x_test, y_test = gather_tensors(test)
    ref_pred = None
    if reference is not None:
        _check_same_sites(reference.model, model_factory())
        ref_pred = reference.predict(x_test, progress=progress, threads=_threads(fit_options))
        warn_unconverged(reference, ref_pred)
    rows, fits = [], {}
    for i, spec in enumerate(guides):
        label, family, options, own = _row(spec)
        if progress:
            tqdm.write(f"[{i + 1}/{len(guides)}] {label}", file=sys.stderr)
        args = {**fit_options, **own}
        args = grouped(args if "run" in args else {"progress": progress, **args})
        if family == "ensemble":
            result = ensemble(model_factory, train, **options, progress=progress, **args)
            parameters, final_elbo = result.num_variational_parameters(), float("nan")
        elif family == "laplace":
            result = laplace(model_factory(), train, options=options, **args)
            parameters, final_elbo = result.num_variational_parameters(), float("nan")
        else:
            guide = guide_family(family, **options) if options else family
            result = run_fit(model_factory(), guide, train, **args)
            parameters = result.guide.num_variational_parameters()
            final_elbo = -(result.epoch_losses[-1] if result.epoch_losses else result.losses[-1])
        threads = _threads(args)  # fit's rule, for both
        metrics = _evaluate(result, x_test, y_test, num_samples, progress, threads, ref_pred)
        rows.append(
            {
                "family": label,
                "parameters": parameters,
                "fit_seconds": result.wall_time,
                "steps_per_second": result.steps / max(result.wall_time, 1e-9),
                "final_elbo": final_elbo,
                **metrics,
            }
        )
        fits[label] = result
    if reference is not None:
        rows.append(_reference_row(reference, ref_pred, y_test))
    import pandas as pd

    table = pd.DataFrame(rows).set_index("family")
    if chart is not None:
        from zoo.plots import comparison_chart

        fig = comparison_chart(table)
        fig.savefig(chart, dpi=120)
    return (table, fits) if return_fits else table


def _threads(fit_options: dict):
    """The ``threads`` of these ``zoo.fit`` options (their engine group's, flat fields
    included)."""
    return group(Engine, grouped(fit_options).get("engine")).threads


def _evaluate(result, x, y, num_samples, progress, threads, ref_pred) -> dict[str, float]:
    """:meth:`zoo.FitResult.evaluate`'s metrics (the same seed-0 draws), and the distances to
    the reference's prediction when there is one, from one prediction."""
    check_labelled_data(result.model, x, y, result.device)
    pred = result.predict(x, num_samples=num_samples, progress=progress, seed=0, threads=threads)
    metrics = result.model.likelihood.metrics(pred, y.to(pred.outputs.device))
    return metrics if ref_pred is None else {**metrics, **distances(pred, ref_pred)}


def _check_same_sites(sampled, model) -> None:
    """Refuse a reference sampled on another architecture than ``model_factory``'s."""
    theirs, ours = getattr(sampled, "site_shapes", None), getattr(model, "site_shapes", None)
    if theirs is not None and ours is not None and dict(theirs) != dict(ours):
        differ = sorted(set(theirs.items()) ^ set(ours.items()))
        raise ValueError(
            "the reference was sampled on another model than model_factory builds (sites that "
            f"differ: {differ}); sample it on model_factory() with the same training data"
        )


def _reference_row(reference, pred, y) -> dict:
    """The reference's own row: its metrics, sampling time and distances to itself."""
    metrics = reference.model.likelihood.metrics(pred, y.to(pred.outputs.device))
    nan = float("nan")
    return {
        "family": "HMC reference",
        "parameters": nan,
        "fit_seconds": reference.wall_time,
        "steps_per_second": nan,
        "final_elbo": nan,
        **metrics,
        **distances(pred, pred),
    }


#: A reference whose output R-hat exceeds this, or whose smallest bulk ESS of the outputs is
#: under ``MIN_ESS``, is not a posterior to measure distances to (Vehtari et al. 2021's bars
#: are 1.01 and 100 per chain; these flag a reference far from them).
MAX_R_HAT, MIN_ESS = 1.05, 50


class ReferenceNotConvergedWarning(UserWarning):
    """``compare``'s reference has not converged by its own diagnostics."""


def warn_unconverged(reference, pred) -> None:
    """Warn when the reference's chains disagree on the test outputs (R-hat, bulk ESS of
    ``pred``, the reference's predictions): the distances would measure its sampling error."""
    from zoo.arviz import chain_diagnostics

    chains, draws = reference.shape
    if chains < 2:
        return
    outputs = pred.outputs.reshape(chains, draws, *pred.outputs.shape[1:])
    found = chain_diagnostics({"outputs": outputs})
    r_hat, ess = found["outputs_r_hat"], found["outputs_ess_bulk"]
    if r_hat > MAX_R_HAT or ess < MIN_ESS:
        warnings.warn(
            f"the reference has not converged by its own diagnostics (output R-hat {r_hat:.3g}, "
            f"smallest bulk ESS {ess:.3g}; bars: R-hat <= {MAX_R_HAT}, ESS >= {MIN_ESS}): the "
            "distances to it measure its sampling error as much as each family's; run it "
            "longer (zoo.reference(..., warmup=, draws=, checkpoint= to extend it))",
            ReferenceNotConvergedWarning,
            stacklevel=3,
        )


#: What an ``"ensemble"`` row of :func:`compare` may set (:func:`zoo.ensemble`'s options).
ENSEMBLE_OPTIONS = frozenset({"members", "family", "seed", "processes"})


def check_row(spec) -> None:
    """Refuse an entry of :func:`compare`'s ``guides`` that could not run, before any fit:
    its shape, and a baseline row's options (as :func:`zoo.ensemble` and
    :class:`zoo.LaplaceOptions` check them)."""
    label, family, options, _ = _row(spec)
    try:
        if family == "ensemble":
            if not set(options) <= ENSEMBLE_OPTIONS:
                raise ValueError(
                    f"it takes the options {sorted(ENSEMBLE_OPTIONS)}, got {sorted(options)}"
                )
            check_ensemble(**{"members": 5, "family": "map", "seed": 0, **options})
        elif family == "laplace":
            LaplaceOptions.of(options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the {family} row {label!r}: {err}") from None


def _row(spec) -> tuple[str, object, dict, dict]:
    """``(label, family, guide_options, fit_options)`` of one entry of ``guides``."""
    if isinstance(spec, str):
        return spec, spec, {}, {}
    if isinstance(spec, tuple) and len(spec) in (3, 4):
        label, family, options, *own = spec
        return label, family, dict(options), dict(own[0]) if own else {}
    raise ValueError(
        "each entry of guides is a family name, (label, family, guide_options) or "
        f"(label, family, guide_options, fit_options); got {spec!r}"
    )
