"""Matplotlib figures. Every function returns the ``Figure`` (nothing is shown or saved)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from zoo.predictive import Prediction  # noqa: E402


def regression_band(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_grid: torch.Tensor,
    prediction: Prediction,
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
