"""``zoo.compare``: the rows (:mod:`zoo.comparison.rows`) made, scored on the same test data and
tabulated."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, overload

from tqdm import tqdm
from typing_extensions import Unpack

import guides as guides_module
from zoo.arguments import check_model_factory
from zoo.comparison.rows import Row, rows_of
from zoo.data.checks import check_labelled_data
from zoo.data.forms import Data, gather_tensors
from zoo.evaluation.agreement import distances
from zoo.results.posterior import Posterior
from zoo.runtime.serial import one_at_a_time
from zoo.training.keywords import HowToFit, fit_arguments, refuses_flat_keywords
from zoo.training.options import (
    Engine,
    group,
    grouped,
)

if TYPE_CHECKING:  # imported where the table is made
    import pandas as pd

nan = float("nan")


# The table alone, or with the fits when return_fits=True (for a type checker).
@overload
def compare(
    model_factory: Callable | None,
    guides: Sequence | Mapping | None = ...,
    train: Data | None = ...,
    test: Data | None = ...,
    *,
    num_samples: int = ...,
    chart: str | os.PathLike | None = ...,
    return_fits: Literal[False] = ...,
    progress: bool = ...,
    reference: Posterior | None = ...,
    **how: Unpack[HowToFit],
) -> pd.DataFrame: ...
@overload
def compare(
    model_factory: Callable | None,
    guides: Sequence | Mapping | None = ...,
    train: Data | None = ...,
    test: Data | None = ...,
    *,
    num_samples: int = ...,
    chart: str | os.PathLike | None = ...,
    return_fits: Literal[True],
    progress: bool = ...,
    reference: Posterior | None = ...,
    **how: Unpack[HowToFit],
) -> tuple[pd.DataFrame, dict[str, Posterior]]: ...


@refuses_flat_keywords
@one_at_a_time
def compare(
    model_factory: Callable | None,
    guides: Sequence | Mapping | None = None,
    train: Data | None = None,
    test: Data | None = None,
    *,
    num_samples: int = 100,
    chart: str | os.PathLike | None = None,
    return_fits: bool = False,
    progress: bool = True,
    reference: Posterior | None = None,
    **how: Unpack[HowToFit],
) -> pd.DataFrame | tuple[pd.DataFrame, dict[str, Posterior]]:
    """Fit each family with the same data, seed and options, or take posteriors already
    fitted, and tabulate them on the same test data: one row each.

    Parameters
    ----------
    model_factory : callable or None
        ``() -> model``; called once per row to fit, so that no fit sees another's state.
        ``None`` when every row is a fitted posterior.
    guides : sequence or mapping, optional
        The rows. A sequence of family names, ``(label, family, guide_options)`` triples,
        e.g. ``("lowrank r=2", "lowrank", {"rank": 2})``, ``(label, family, guide_options,
        fit_options)`` for options of that row's ``zoo.fit`` only (a mapping of ``zoo.fit``'s
        named arguments, groups or their fields, which override the call's), e.g. ``("MC
        dropout", "mc_dropout", {"p": 0.1}, {"estimator": "local"})``, or ``(label,
        posterior)`` for a posterior already made. A mapping ``{label: family name or
        posterior}`` is the same: ``{"diagonal": fit, "5 MAP nets": ens, "NUTS": ref}`` compares
        what one has without refitting. Default: every registered family
        (``guides.available()``).
        A deep ensemble is a row to fit too: ``("5 MAP nets", "ensemble", {"members": 5,
        "family": "map"})`` runs :func:`zoo.ensemble`; so is the Laplace approximation
        (laplace-torch installed): ``("Laplace, last-layer KFAC", "laplace", {"weights":
        "last_layer", "hessian": "kron"})`` takes :class:`zoo.LaplaceOptions`' fields and runs
        :func:`zoo.laplace` (a MAP fit with the row's fit options, then laplace-torch; with
        ``"at": "module"`` among them, post-hoc at the weights of a converted trained network,
        no MAP fit; with ``"prior_precision": "gridsearch"``, its held-out data as
        ``"validation": (X_val, y_val)``). Every other row of a converted trained network
        starts at its weights (``zoo.models.from_module``'s ``init="module"``), except an
        ensemble's members, which start from fresh draws (:func:`zoo.ensemble`).
    train, test
        Training and held-out data (``(X, y)``, a Dataset or a DataLoader); ``train`` is needed
        only for rows to fit.
    num_samples : int
        Posterior samples per test input.
    chart : path, optional
        Where to save a bar chart of the test metrics (PNG, PDF, ...).
    return_fits : bool
        Also return ``{label: Posterior}``.
    progress : bool
        A line per row as it starts, and the fits' and evaluations' progress bars (unless
        ``run`` is given: then its ``progress`` rules the fits').
    reference : zoo.Reference, optional
        An HMC reference of the same model and training data (:func:`zoo.reference`): each
        row also gets its distances to it on ``test``
        (:func:`zoo.evaluation.agreement.distances`: ``agreement`` and ``total_variation``, or
        ``w2``, ``sd_ratio`` and ``reference_coverage``), and the reference gets its own last
        row (``"HMC reference"``, its sampling time as ``fit_seconds``, its distances to
        itself).
    **how : HowToFit
        Every fit's :func:`zoo.fit` arguments (:class:`zoo.training.keywords.HowToFit`); the
        engine's ``threads`` also sets the evaluations' CPU threads.

    Returns
    -------
    pandas.DataFrame
        Indexed by label: ``parameters`` (the numbers that define the posterior; NaN for
        draws), how it was fitted (:meth:`zoo.Posterior.fitting`: ``steps``, every optimiser
        update, a rate test's included; ``lr``, the rate the fit ran at; ``lr_rule``, what chose
        it), ``fit_seconds`` (a rate test's included), ``steps_per_second``, ``final_elbo``
        (mean ``ELBO`` of the last epoch, full-data scale; NaN where there is none),
        ``objective`` (what that number is, :data:`OBJECTIVE_LABELS`: compare ``final_elbo``
        only between rows labelled "model's ELBO"), then the test metrics of
        :meth:`zoo.Posterior.evaluate` (seed 0), then the distances to ``reference`` when one
        is given. MC dropout's ``final_elbo`` contains ``-n log sigma`` (its ``q`` is nearly
        degenerate), a point mass's is a log joint density (no entropy), WHVI's bounds its own
        model's evidence: compare the test metrics across those.
    """
    if test is None:
        raise ValueError("compare needs test data (test=...) to score every row")
    rows = rows_of(guides_module.available() if guides is None else guides)
    if any(row.posterior is None for row in rows) and train is None:
        raise ValueError("compare needs train data for the rows it fits")
    if model_factory is not None or any(row.posterior is None for row in rows):
        check_model_factory(model_factory, "compare")
    base = fit_arguments(progress, how, "compare")
    x_test, y_test = gather_tensors(test)
    _check_posteriors(rows, model_factory, reference)
    ref_pred = None
    if reference is not None:
        threads = group(Engine, base.get("engine")).threads
        ref_pred = reference.predict(x_test, progress=progress, threads=threads)
        warn_unconverged(reference, ref_pred)
    table_rows, fits = [], {}
    for i, row in enumerate(rows):
        if progress:
            tqdm.write(f"[{i + 1}/{len(rows)}] {row.label}", file=sys.stderr)
        args = grouped({**base, **row.fit_options})
        result = row.produce(model_factory, train, args, progress)
        row_threads = group(Engine, args.get("engine")).threads
        metrics = _evaluate(result, x_test, y_test, num_samples, progress, row_threads, ref_pred)
        table_rows.append(_table_row(row.label, result, metrics))
        fits[row.label] = result
    if reference is not None:
        table_rows.append(_reference_row(reference, ref_pred, y_test))
    table = _table(table_rows, chart)
    return (table, fits) if return_fits else table


def _check_posteriors(rows: list[Row], model_factory, reference) -> None:
    """Refuse a posterior given (a row's, the reference) of another model than the others'."""
    given = [row.posterior for row in rows if row.posterior is not None]
    if not given and reference is None:
        return
    # the model to hold their sites against, built only now
    model = model_factory() if model_factory is not None else given[0].model
    for row in rows:
        if row.posterior is not None:
            _check_same_sites(row.posterior.model, model, f"the row {row.label!r}")
    if reference is not None:
        _check_same_sites(reference.model, model, "the reference")


def _table_row(label: str, result: Posterior, metrics: dict) -> dict:
    """One row of the table: the posterior's size, how it was fitted, its time and ELBO, then
    ``metrics``."""
    how = result.fitting()
    steps = how["steps"]
    return {
        "family": label,
        "parameters": result.num_variational_parameters(),
        "steps": steps,
        "lr": how["lr"],
        "lr_rule": how["lr_rule"],
        "fit_seconds": result.wall_time,
        "steps_per_second": steps / max(result.wall_time, 1e-9) if steps else nan,
        "final_elbo": result.final_elbo,
        "objective": OBJECTIVE_LABELS.get(result.objective, result.objective),
        **metrics,
    }


def _table(table_rows: list[dict], chart) -> pd.DataFrame:
    """The rows as a table indexed by label, its chart saved to ``chart`` when given."""
    import pandas as pd

    table = pd.DataFrame(table_rows).set_index("family")
    if chart is not None:
        from zoo.evaluation.plots import comparison_chart

        comparison_chart(table).savefig(chart, dpi=120)
    return table


#: How the table names what each row's ``final_elbo`` is (``zoo.Posterior.objective``): only
#: rows labelled "model's ELBO" bound the same number, the evidence of the model as written.
OBJECTIVE_LABELS = {
    "model": "model's ELBO",
    "whvi_model": "ELBO of WHVI's own model",
    "conditional": "ELBO given point masses",
    "map": "log joint (MAP), no bound",
    "mc_dropout": "MC dropout's ELBO",
    "none": "none",
}


def _evaluate(result, x, y, num_samples, progress, threads, ref_pred) -> dict[str, float]:
    """:meth:`zoo.FitResult.evaluate`'s metrics (the same seed-0 draws), and the distances to
    the reference's prediction when there is one, from one prediction."""
    check_labelled_data(result.model, x, y, result.device)
    options = result.predict_options(num_samples, progress=progress, threads=threads)
    summary = result.summarise(x, y, options)  # online, one block of draws at a time
    metrics = summary.metrics()
    return metrics if ref_pred is None else {**metrics, **distances(summary.condensed(), ref_pred)}


def _check_same_sites(sampled, model, what: str) -> None:
    """Refuse a posterior (the reference, a fitted row) of another architecture than
    ``model``'s (``model_factory``'s, or the first fitted row's)."""
    theirs, ours = getattr(sampled, "site_shapes", None), getattr(model, "site_shapes", None)
    if theirs is not None and ours is not None and dict(theirs) != dict(ours):
        differ = sorted(set(theirs.items()) ^ set(ours.items()))
        raise ValueError(
            f"{what} is of another model than the other rows' (sites that differ: {differ}); "
            "every row must be a posterior of the same model, on the same training data"
        )


def _reference_row(reference, pred, y) -> dict:
    """The reference's own row: its metrics, sampling time and distances to itself."""
    metrics = reference.model.likelihood.metrics(pred, y.to(pred.outputs.device))
    nan = float("nan")
    return {
        "family": "HMC reference",
        "parameters": nan,
        "steps": 0,
        "lr": nan,
        "lr_rule": "NUTS (no rate)",
        "fit_seconds": reference.wall_time,
        "steps_per_second": nan,
        "final_elbo": nan,
        "objective": OBJECTIVE_LABELS["none"],
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
    from zoo.evaluation.arviz import chain_diagnostics

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
