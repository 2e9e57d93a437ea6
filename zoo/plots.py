"""Matplotlib figures. Every function returns the ``Figure`` (nothing is shown or saved)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)
from collections.abc import Sequence  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from zoo.prediction import RegressionPrediction  # noqa: E402


def regression_band(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_grid: torch.Tensor,
    prediction: RegressionPrediction,
    truth: torch.Tensor | None = None,
    level: float = 0.95,
    title: str | None = None,
):
    """Predictive mean and central ``level`` band (epistemic + aleatoric) over 1D data."""
    xs = x_grid.reshape(-1).cpu()
    mean = prediction.mean.reshape(-1).cpu()
    lower, upper = (t.reshape(-1).cpu() for t in prediction.interval(level))
    epi = prediction.epistemic_variance.reshape(-1).sqrt().cpu()
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    ax.fill_between(xs, lower, upper, color="C0", alpha=0.2, label=f"{level:.0%} predictive")
    ax.fill_between(
        xs, mean - 2 * epi, mean + 2 * epi, color="C0", alpha=0.35, label="±2 sd epistemic"
    )
    ax.plot(xs, mean, color="C0", lw=2, label="predictive mean")
    if truth is not None:
        ax.plot(xs, truth.reshape(-1).cpu(), "k--", lw=1, label="true function")
    ax.scatter(x_train.reshape(-1).cpu(), y_train.reshape(-1).cpu(), s=8, c="k", label="data")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    return fig


def reliability_diagram(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15, title=None):
    """Accuracy against confidence per equal-width bin, with the bin counts and the ECE."""
    from zoo import metrics

    rel = metrics.reliability(probs.cpu(), labels.cpu(), n_bins)
    centers = ((rel["edges"][:-1] + rel["edges"][1:]) / 2).numpy()
    width = 1.0 / n_bins
    fig, (ax, axc) = plt.subplots(
        2, 1, figsize=(5, 5.5), sharex=True, height_ratios=(3, 1), layout="constrained"
    )
    acc = torch.nan_to_num(rel["accuracy"]).numpy()
    ax.bar(centers, acc, width=width, edgecolor="k", color="C0", alpha=0.8, label="accuracy")
    gap = torch.nan_to_num(rel["confidence"] - rel["accuracy"]).numpy()
    ax.bar(centers, gap, bottom=acc, width=width, color="C3", alpha=0.3, label="gap")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ece = metrics.ece(probs.cpu(), labels.cpu(), n_bins)
    ax.set_ylabel("accuracy")
    ax.set_title(title or f"Reliability (ECE = {ece:.4f})")
    ax.legend(loc="upper left", fontsize="small")
    axc.bar(centers, rel["count"].numpy(), width=width, color="C7", edgecolor="k")
    axc.set_yscale("log")
    axc.set_xlabel("confidence (top-label probability)")
    axc.set_ylabel("count")
    return fig


def entropy_histograms(
    in_scores: torch.Tensor,
    out_scores: torch.Tensor,
    label="predictive entropy",
    names=("in-distribution", "out-of-distribution"),
    bins: int = 40,
):
    """Histograms of an uncertainty score on in- and out-of-distribution inputs."""
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    hi = float(max(in_scores.max(), out_scores.max()))
    edges = torch.linspace(0, hi if hi > 0 else 1.0, bins + 1).numpy()
    ax.hist(in_scores.cpu().numpy(), bins=edges, alpha=0.6, density=True, label=names[0])
    ax.hist(out_scores.cpu().numpy(), bins=edges, alpha=0.6, density=True, label=names[1])
    ax.set_xlabel(label)
    ax.set_ylabel("density")
    ax.legend()
    return fig


def class_probability_boxplots(sample_probs: torch.Tensor, label: int | None = None, title=None):
    """Posch & Pilz's box plots: the ``S`` sampled probabilities of each class for one input
    (``sample_probs`` is ``(S, C)``)."""
    probs = sample_probs.detach().cpu().numpy()
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    ax.boxplot([probs[:, c] for c in range(probs.shape[1])], whis=(2.5, 97.5), showfliers=False)
    ax.set_xticks(range(1, probs.shape[1] + 1), [str(c) for c in range(probs.shape[1])])
    ax.set_xlabel("class" + (f" (true: {label})" if label is not None else ""))
    ax.set_ylabel("sampled probability")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "class probabilities over sampled networks (whiskers: 95%)")
    return fig


def training_curves(losses: dict[str, list[float]] | list[float], smooth: int = 20):
    """``-ELBO`` per step (a moving average over ``smooth`` steps), one line per fit."""
    if not isinstance(losses, dict):
        losses = {"fit": losses}
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    for name, values in losses.items():
        t = torch.tensor(values, dtype=torch.float64)
        k = max(1, min(smooth, len(t)))
        avg = torch.nn.functional.avg_pool1d(t[None, None], k, stride=1)[0, 0]
        ax.plot(range(k, len(t) + 1), avg.numpy(), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("-ELBO (full-data scale)")
    ax.set_yscale("symlog")
    ax.legend(fontsize="small")
    return fig


def comparison_chart(table, metrics: Sequence[str] | None = None):
    """Bar charts of chosen columns of a ``zoo.compare`` table, one panel per metric."""
    metrics = list(
        metrics
        or [
            c
            for c in ("accuracy", "nll", "ece", "brier", "rmse", "coverage_95", "seconds_per_step")
            if c in table
        ]
    )
    fig, axes = plt.subplots(1, len(metrics), figsize=(3 * len(metrics), 3.2), layout="constrained")
    axes = [axes] if len(metrics) == 1 else list(axes)
    names = [str(i) for i in table.index]
    for ax, metric in zip(axes, metrics):
        ax.bar(names, table[metric].to_numpy(), color=[f"C{i}" for i in range(len(names))])
        ax.set_title(metric)
        ax.tick_params(axis="x", rotation=45)
    return fig
