"""Matplotlib figures. Every function returns the ``Figure`` (nothing is shown or saved).

Nothing here sets the backend: a Jupyter kernel keeps its inline backend, a script its own.
Each figure is made through ``pyplot`` (so that Jupyter's inline support, which registers how a
``Figure`` is shown as an image, is active) and closed at once: a notebook shows the returned
figure once, as an image, and no figure stays open in ``pyplot``'s registry. Save one with
``fig.savefig(path)``. Functions with one panel take ``ax=`` to draw into an existing axis
(then they return ``ax.figure``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zoo import metrics
from zoo.arguments import check_int

if TYPE_CHECKING:
    import pandas as pd

#: Columns of a ``zoo.compare`` table that :func:`comparison_chart` draws by default.
COMPARISON_METRICS = ("accuracy", "nll", "ece", "brier", "rmse", "coverage_95", "steps_per_second")


def new_figure(**options: Any) -> Figure:
    """``plt.figure(**options)`` taken out of pyplot's registry at once (see the module doc)."""
    fig = plt.figure(**options)
    plt.close(fig)
    return fig


def panels(
    count: int,
    per_row: int = 5,
    panel_size: tuple[float, float] = (3.4, 3.25),
    **subplot_options: Any,
) -> tuple[Figure, list[Axes]]:
    """A figure of exactly ``count`` panels, ``per_row`` to a row, for one panel per item.

    The grid has ``ceil(count / per_row)`` rows of ``min(count, per_row)`` panels; the cells past
    ``count`` in the last row are removed, so ``zip(axes, items, strict=True)`` draws every item
    or raises (a fixed grid silently drops the items past its size). ``panel_size``: one panel's
    ``(width, height)`` in inches; ``subplot_options`` go to ``Figure.subplots`` (``sharex=``,
    ``sharey=``).

    Returns
    -------
    tuple[Figure, list[Axes]]
        The figure (constrained layout, out of pyplot's registry) and its ``count`` axes, row
        by row.
    """
    check_int("count", count, 1, meaning="panels in the figure")
    check_int("per_row", per_row, 1, meaning="panels in a row")
    columns = min(per_row, count)
    rows = -(-count // columns)
    width, height = panel_size
    fig = new_figure(figsize=(width * columns, height * rows), layout="constrained")
    grid = list(fig.subplots(rows, columns, squeeze=False, **subplot_options).ravel())
    for ax in grid[count:]:
        ax.remove()
    return fig, grid[:count]


def _figure_and_axis(ax, figsize):
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots()


def _predictive(posterior_or_prediction, x: torch.Tensor):
    """A prediction as it is; a posterior (anything with ``predict``, every
    :class:`zoo.Posterior`) as its predictive on ``x`` with seed 0 and no progress bar."""
    if hasattr(posterior_or_prediction, "predict"):
        inputs = x.reshape(-1, 1) if x.dim() == 1 else x
        return posterior_or_prediction.predict(inputs, progress=False)
    return posterior_or_prediction


def regression_band(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_grid: torch.Tensor,
    prediction: Any,  # a RegressionPrediction, or a posterior whose predict makes one
    truth: torch.Tensor | None = None,
    level: float = 0.95,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Predictive mean and central ``level`` band (epistemic + aleatoric) over 1-D inputs.

    ``x_grid`` is ``(N,)`` or ``(N, 1)`` and ``prediction`` a ``zoo.RegressionPrediction`` on it
    with one target, or any :class:`zoo.Posterior` (its predictive on ``x_grid``, seed 0); the
    darker band is ``±2`` epistemic standard deviations.
    """
    for name, x in (("x_grid", x_grid), ("x_train", x_train)):
        if x.dim() > 2 or (x.dim() == 2 and x.shape[1] != 1):
            raise ValueError(
                f"regression_band draws 1-D inputs, but {name} has shape {tuple(x.shape)}; plot "
                "one feature against the others fixed, or the predictions against the targets"
            )
    prediction = _predictive(prediction, x_grid)
    xs = x_grid.reshape(-1).cpu()
    mean = prediction.mean.reshape(-1).cpu()
    if mean.shape != xs.shape:
        raise ValueError(
            f"the prediction has {mean.numel()} values for {xs.numel()} grid points (one target "
            "per input is drawn)"
        )
    lower, upper = (t.reshape(-1).cpu() for t in prediction.interval(level))
    epi = prediction.epistemic_variance.reshape(-1).sqrt().cpu()
    fig, ax = _figure_and_axis(ax, (7, 4))
    ax.fill_between(xs, lower, upper, color="C0", alpha=0.2, label=f"{level:.0%} predictive")
    ax.fill_between(
        xs, mean - 2 * epi, mean + 2 * epi, color="C0", alpha=0.35, label="±2 sd epistemic"
    )
    ax.plot(xs, mean, color="C0", lw=2, label="predictive mean")
    if truth is not None:
        ax.plot(xs, truth.reshape(-1).cpu(), "k--", lw=1, label="true function")
    _data_and_labels(ax, x_train, y_train, title, point_size=8, legend_size="small")
    return fig


def _data_and_labels(ax, x_train, y_train, title, point_size: float, legend_size: str) -> None:
    """The training points of a 1-D band plot, its axis labels, title and legend."""
    x, y = x_train.reshape(-1).cpu(), y_train.reshape(-1).cpu()
    ax.scatter(x, y, s=point_size, c="k", label="data")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", fontsize=legend_size)


def reliability_diagram(
    probs: torch.Tensor,
    labels: torch.Tensor,
    n_bins: int = 15,
    title: str | None = None,
    ax: Axes | None = None,
    legend: bool = True,
) -> Figure:
    """Accuracy against confidence per equal-width bin, with the ECE in the title; below it the
    bin counts (a second panel, left out when drawing into a given ``ax``). The legend stands
    beside the panel; in a row of panels give it to the last one only (``legend=False`` for
    the others), where it covers no neighbour."""

    rel = metrics.reliability(probs.cpu(), labels.cpu(), n_bins)
    centers = ((rel["edges"][:-1] + rel["edges"][1:]) / 2).numpy()
    width = 1.0 / n_bins
    axc = None
    if ax is None:
        fig = new_figure(figsize=(7.5, 5.5), layout="constrained")
        ax, axc = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    else:
        fig = cast(Figure, ax.figure)
    acc = torch.nan_to_num(rel["accuracy"]).numpy()
    ax.bar(centers, acc, width=width, edgecolor="k", color="C0", alpha=0.8, label="accuracy")
    gap = torch.nan_to_num(rel["confidence"] - rel["accuracy"]).numpy()
    ax.bar(
        centers,
        gap,
        bottom=acc,
        width=width,
        color="C3",
        alpha=0.3,
        label="gap to the bin's mean confidence\n(above a bar: over-confident,\n"
        "inside it: under-confident)",
    )
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ece = metrics.ece(probs.cpu(), labels.cpu(), n_bins)
    ax.set_ylabel("accuracy")
    ax.set_title(title or f"Reliability (ECE = {ece:.4f})")
    # Beside the panel, where it covers no bar.
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    if axc is not None:
        axc.bar(centers, rel["count"].numpy(), width=width, color="C7", edgecolor="k")
        axc.set_yscale("log")
        axc.set_ylabel("count")
    (axc or ax).set_xlabel("confidence (top-label probability)")
    return fig


def entropy_histograms(
    in_scores: torch.Tensor,
    out_scores: torch.Tensor,
    label: str = "predictive entropy",
    names: tuple[str, str] = ("in-distribution", "out-of-distribution"),
    bins: int = 40,
    ax: Axes | None = None,
) -> Figure:
    """Histograms of an uncertainty score on in- and out-of-distribution inputs."""
    fig, ax = _figure_and_axis(ax, (6, 3.5))
    hi = float(max(in_scores.max(), out_scores.max()))
    edges = torch.linspace(0, hi if hi > 0 else 1.0, bins + 1).tolist()
    ax.hist(in_scores.cpu().numpy(), bins=edges, alpha=0.6, density=True, label=names[0])
    ax.hist(out_scores.cpu().numpy(), bins=edges, alpha=0.6, density=True, label=names[1])
    ax.set_xlabel(label)
    ax.set_ylabel("density")
    ax.legend()
    return fig


def class_probability_boxplots(
    sample_probs: torch.Tensor,
    label: int | None = None,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Posch & Pilz's box plots: the ``S`` sampled probabilities of each class for one input
    (``sample_probs`` is ``(S, C)``)."""
    probs = sample_probs.detach().cpu().numpy()
    fig, ax = _figure_and_axis(ax, (6, 3.5))
    ax.boxplot([probs[:, c] for c in range(probs.shape[1])], whis=(2.5, 97.5), showfliers=False)
    ax.set_xticks(range(1, probs.shape[1] + 1), [str(c) for c in range(probs.shape[1])])
    ax.set_xlabel("class" + (f" (true: {label})" if label is not None else ""))
    ax.set_ylabel("sampled probability")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "class probabilities over sampled networks (whiskers: 95%)")
    return fig


def class_ppc(
    observed: torch.Tensor | np.ndarray,
    replicated: torch.Tensor | np.ndarray,
    num_classes: int | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Posterior predictive check of class labels, one bin per class: the observed count of each
    class (bars) and the count in each replicated data set (``replicated``: ``(S, N)`` labels
    drawn from the posterior predictive), as its median with the central 90% over the ``S``
    draws (error bars)."""
    observed = torch.as_tensor(observed).long().reshape(-1)
    replicated = torch.as_tensor(replicated).long().reshape(-1, observed.numel())
    k = num_classes or int(max(observed.max(), replicated.max())) + 1
    counts = torch.stack([torch.bincount(r, minlength=k) for r in replicated]).double()
    low, mid, high = torch.quantile(counts, torch.tensor([0.05, 0.5, 0.95], dtype=counts.dtype), 0)
    fig, ax = _figure_and_axis(ax, (max(4.0, 0.5 * k + 2), 3.2))
    classes = torch.arange(k).numpy()
    ax.bar(
        classes,
        torch.bincount(observed, minlength=k).numpy(),
        width=0.6,
        color="C0",
        alpha=0.6,
        label="observed",
    )
    yerr = torch.stack([mid - low, high - mid]).numpy()
    ax.errorbar(
        classes,
        mid.numpy(),
        yerr=yerr,
        fmt="o",
        color="C1",
        capsize=3,
        label=f"replicated (median, 90% of {counts.shape[0]} draws)",
    )
    ax.set_xticks(classes)
    ax.set_xlabel("class")
    ax.set_ylabel("count")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def training_curves(
    losses: dict[str, list[float]] | list[float], smooth: int = 20, ax: Axes | None = None
) -> Figure:
    """``-ELBO`` per step (a moving average over ``smooth`` steps), one line per fit."""
    if not isinstance(losses, dict):
        losses = {"fit": losses}
    fig, ax = _figure_and_axis(ax, (6, 3.5))
    for name, values in losses.items():
        t = torch.tensor(values, dtype=torch.float64)
        k = max(1, min(smooth, len(t)))
        avg = torch.nn.functional.avg_pool1d(t[None, None], k, stride=1)[0, 0]
        ax.plot(range(k, len(t) + 1), avg.numpy(), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("-ELBO (full-data scale)")
    every = torch.tensor([v for vs in losses.values() for v in vs], dtype=torch.float64)
    every = every[torch.isfinite(every)]
    # A log axis only where the losses span a decade or more: under a decade a log axis shows
    # no labelled tick at all; a sign change needs symlog.
    if every.numel() and every.min() > 0 and every.max() >= 10 * every.min():
        ax.set_yscale("log")
    elif every.numel() and every.min() <= 0 < every.max() and every.abs().max() >= 10:
        ax.set_yscale("symlog")
    ax.legend(fontsize="small")
    return fig


def comparison_chart(
    table: pd.DataFrame, metrics: Sequence[str] | None = None, axes: Sequence[Axes] | None = None
) -> Figure:
    """Bar charts of columns of a ``zoo.compare`` table, one panel per metric (default: those
    of :data:`COMPARISON_METRICS` in the table). ``axes``: one existing axis per metric."""
    metrics = list(metrics or [c for c in COMPARISON_METRICS if c in table])
    missing = [m for m in metrics if m not in table]
    if missing:
        raise ValueError(f"the table has no columns {missing}; its columns are {list(table)}")
    if axes is None:
        fig = new_figure(figsize=(3 * len(metrics), 3.2), layout="constrained")
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    elif len(axes) != len(metrics):
        raise ValueError(f"got {len(axes)} axes for {len(metrics)} metrics")
    fig = cast(Figure, axes[0].figure)
    names = [str(i) for i in table.index]
    for ax, metric in zip(axes, metrics):
        ax.bar(names, table[metric].to_numpy(), color=[f"C{i}" for i in range(len(names))])
        ax.set_title(metric)
        # each label ends under its bar (centred rotated labels of long names overlap)
        ax.tick_params(axis="x", rotation=45)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")
    return fig


def band_against_reference(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_grid: torch.Tensor,
    prediction: Any,  # a RegressionPrediction, or a posterior whose predict makes one
    reference: Any,
    level: float = 0.95,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """A predictive's central ``level`` band and mean (blue) over a reference predictive's
    (grey: an HMC reference's, :func:`zoo.reference`), both ``zoo.RegressionPrediction`` on the
    1-D inputs ``x_grid`` ``(N,)`` or ``(N, 1)`` or any :class:`zoo.Posterior` (predicted on
    ``x_grid``), with the training data."""
    prediction, reference = _predictive(prediction, x_grid), _predictive(reference, x_grid)
    xs = x_grid.reshape(-1).cpu()
    fig, ax = _figure_and_axis(ax, (7, 4))
    for pred, color, label, alpha in (
        (reference, "0.5", "reference", 0.35),
        (prediction, "C0", "approximation", 0.3),
    ):
        if pred.mean.numel() != xs.numel():
            raise ValueError(
                f"the {label}'s prediction has {pred.mean.numel()} values for {xs.numel()} grid "
                "points (one target per input is drawn)"
            )
        lower, upper = (t.reshape(-1).cpu() for t in pred.interval(level))
        ax.fill_between(
            xs, lower, upper, color=color, alpha=alpha, lw=0, label=f"{label} {level:.0%}"
        )
        ax.plot(xs, pred.mean.reshape(-1).cpu(), color=color, lw=1.5)
    _data_and_labels(ax, x_train, y_train, title, point_size=6, legend_size="x-small")
    return fig


def uncertainty_map(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    grid: tuple[torch.Tensor, torch.Tensor],
    values: torch.Tensor,
    title: str | None = None,
    vmax: float | None = None,
    ax: Axes | None = None,
) -> Figure:
    """A per-input uncertainty (e.g. ``prediction.entropy``, in nats) over a 2-D grid, with the
    training points coloured by class. ``grid``: the ``(H, W)`` coordinate arrays of
    ``torch.meshgrid(..., indexing="xy")``; ``values``: ``H W`` numbers in the grid's order."""
    gx, gy = (g.cpu() for g in grid)
    if values.numel() != gx.numel():
        raise ValueError(f"got {values.numel()} values for a grid of {tuple(gx.shape)} points")
    fig, ax = _figure_and_axis(ax, (4.5, 4))
    mesh = ax.pcolormesh(
        gx, gy, values.reshape(gx.shape).cpu(), cmap="viridis", vmin=0, vmax=vmax, shading="auto"
    )
    x0, x1 = x_train.cpu().T[:2]
    ax.scatter(x0, x1, c=y_train.cpu(), cmap="coolwarm", s=6, edgecolors="w", lw=0.3)
    fig.colorbar(mesh, ax=ax, shrink=0.8)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize="small")
    return fig
