import pytest
import torch

import zoo
from zoo import plots
from zoo.models.predictions import RegressionPrediction


def written(fig, tmp_path, name):
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    return path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 2000


def test_every_plot_writes_a_png(tmp_path):
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(200, 10), -1)
    labels = torch.randint(0, 10, (200,))
    assert written(plots.reliability_diagram(probs, labels), tmp_path, "rel")
    assert written(plots.entropy_histograms(torch.rand(100), torch.rand(80) + 1), tmp_path, "ent")
    assert written(
        plots.class_probability_boxplots(torch.softmax(torch.randn(50, 10), -1), 3), tmp_path, "box"
    )
    assert written(
        plots.training_curves({"a": list(range(100, 0, -1)), "b": [5.0] * 50}), tmp_path, "curve"
    )
    import pandas as pd

    table = pd.DataFrame(
        {"accuracy": [0.9, 0.95], "nll": [0.3, 0.2]}, index=["diagonal", "lowrank"]
    )
    assert written(plots.comparison_chart(table), tmp_path, "cmp")
    x = torch.linspace(-3, 3, 50)
    means = torch.sin(x)[None] + 0.1 * torch.randn(20, 50)
    pred = RegressionPrediction(
        means, sample_means=means, sample_scales=torch.full_like(means, 0.1)
    )
    assert written(
        plots.regression_band(x, torch.sin(x), x, pred, truth=torch.sin(x)), tmp_path, "band"
    )


@pytest.mark.slow  # quick tier: under three minutes
def test_importing_plots_leaves_the_backend_alone():
    import subprocess
    import sys

    code = (
        "import matplotlib; matplotlib.use('svg'); import zoo.plots, zoo.arviz; "
        "print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_plots_draw_into_a_given_axis_and_register_no_pyplot_figure():
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    open_before = plt.get_fignums()
    fig = Figure()
    left, right = fig.subplots(1, 2)
    x = torch.linspace(-3, 3, 20)
    means = torch.sin(x)[None] + 0.1 * torch.randn(10, 20)
    pred = RegressionPrediction(
        means, sample_means=means, sample_scales=torch.full_like(means, 0.1)
    )
    assert plots.regression_band(x, torch.sin(x), x, pred, ax=left) is fig
    probs = torch.softmax(torch.randn(50, 3), -1)
    assert plots.reliability_diagram(probs, torch.randint(0, 3, (50,)), ax=right) is fig
    assert len(left.collections) >= 2 and len(right.patches) > 0
    assert right.get_legend() is not None
    first = Figure().subplots()
    plots.reliability_diagram(probs, torch.randint(0, 3, (50,)), ax=first, legend=False)
    assert first.get_legend() is None  # a row's panels leave the legend to the last one
    plots.entropy_histograms(torch.rand(10), torch.rand(10))
    assert plt.get_fignums() == open_before


def test_plot_errors_say_what_is_wrong():
    import pandas as pd
    import pytest

    x2 = torch.randn(20, 2)
    means = torch.randn(5, 20)
    pred = RegressionPrediction(means, sample_means=means, sample_scales=torch.ones_like(means))
    with pytest.raises(ValueError, match="1-D inputs.*shape \\(20, 2\\)"):
        plots.regression_band(x2, torch.randn(20), x2, pred)
    table = pd.DataFrame({"accuracy": [0.9], "steps_per_second": [30.0]}, index=["diagonal"])
    fig = plots.comparison_chart(table)  # the default columns are those compare writes
    assert [ax.get_title() for ax in fig.axes] == ["accuracy", "steps_per_second"]
    with pytest.raises(ValueError, match="no columns \\['seconds_per_step'\\]"):
        plots.comparison_chart(table, ["seconds_per_step"])


def labelled_ticks_in_view(ax) -> int:
    """Major y ticks with a label inside the axis' view (what a reader can read off)."""
    fig = ax.figure
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    return sum(
        1
        for tick, label in zip(ax.get_yticks(), ax.get_yticklabels())
        if lo <= tick <= hi and label.get_text()
    )


@pytest.mark.parametrize(
    "losses",
    [
        [300.0 - i * 0.5 for i in range(200)],  # under a decade
        [1e5 * 0.97**i + 50 for i in range(200)],  # several decades
        [20.0 - 0.2 * i for i in range(200)],  # through zero
    ],
)
def test_training_curves_always_have_readable_y_ticks(losses):
    from zoo import plots

    fig = plots.training_curves({"fit": losses})
    assert labelled_ticks_in_view(fig.axes[0]) >= 2


def test_the_reliability_legend_explains_the_gap_and_covers_no_bar():
    from zoo import plots

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(500, 10, generator=g), -1)
    labels = torch.randint(0, 10, (500,), generator=g)
    fig = plots.reliability_diagram(probs, labels)
    ax = fig.axes[0]
    fig.canvas.draw()
    legend = ax.get_legend()
    assert "over-confident" in " ".join(t.get_text() for t in legend.get_texts())
    box = legend.get_window_extent()
    for bar in ax.patches:
        assert not box.overlaps(bar.get_window_extent())


def test_the_class_ppc_has_one_bin_per_class():
    import zoo.arviz as zaz

    x, y = torch.randn(120, 3), torch.arange(120) % 7
    fit = zoo.fit(
        zoo.models.BayesianMLP(3, (8,), 7, task="classification"),
        "diagonal",
        (x, y),
        num_steps=3,
        run=zoo.Run(progress=False),
    )
    idata = fit.to_arviz((x, y), num_samples=30, progress=False)
    fig = zaz.plot_ppc(idata)
    ax = fig.axes[0]
    bars = [p for p in ax.patches]
    assert len(bars) == 7  # one per class
    assert [round(b.get_height()) for b in bars] == torch.bincount(y).tolist()
    assert list(ax.get_xticks()) == list(range(7))


def test_reference_plots_draw_and_refuse_mismatched_sizes(tmp_path):
    torch.manual_seed(0)
    grid = torch.linspace(-3, 3, 50)
    means = torch.randn(20, 50)
    pred = RegressionPrediction(means, sample_means=means, sample_scales=torch.full((20, 50), 0.1))
    ref = RegressionPrediction(means, sample_means=means * 1.1, sample_scales=torch.ones(20, 50))
    x, y = torch.randn(30, 1), torch.randn(30)
    assert written(plots.band_against_reference(x, y, grid, pred, ref), tmp_path, "band")
    with pytest.raises(ValueError, match="49 grid points"):
        plots.band_against_reference(x, y, grid[:49], pred, ref)
    gx, gy = torch.meshgrid(torch.linspace(-1, 1, 30), torch.linspace(-1, 1, 20), indexing="xy")
    values = torch.rand(600)
    fig = plots.uncertainty_map(torch.randn(40, 2), torch.randint(2, (40,)), (gx, gy), values)
    assert written(fig, tmp_path, "map")
    with pytest.raises(ValueError, match="599 values for a grid of \\(20, 30\\)"):
        plots.uncertainty_map(torch.randn(40, 2), torch.randint(2, (40,)), (gx, gy), values[1:])


def test_band_plots_take_any_posterior(tmp_path):
    """A posterior is drawn as its predictive on the grid (seed 0): the figure of a fit and of
    draws given to from_draws equals the figure of their predictions."""
    x, y = zoo.data.toy_regression(n=40, seed=0)
    fit = zoo.fit(zoo.models.BayesianMLP(1, (8,), 1, noise=0.1), "diagonal", (x, y),
                  num_steps=20, run=zoo.Run(progress=False))  # fmt: skip
    draws = zoo.from_draws(fit.model, fit.sample(30, seed=1))
    grid = torch.linspace(-2, 2, 25)
    fig = plots.regression_band(x, y, grid, fit)
    line = fig.axes[0].lines[0].get_ydata()
    want = fit.predict(grid[:, None], progress=False).mean.reshape(-1)
    assert torch.allclose(torch.as_tensor(line, dtype=want.dtype), want)
    assert written(plots.band_against_reference(x, y, grid, fit, draws), tmp_path, "posteriors")


@pytest.mark.parametrize(
    "count, per_row, shape", [(1, 5, (1, 1)), (4, 5, (1, 4)), (9, 5, (2, 5)), (10, 5, (2, 5))]
)
def test_panels_gives_exactly_one_axis_per_item_row_by_row(count, per_row, shape, tmp_path):
    fig, axes = plots.panels(count, per_row=per_row, panel_size=(2.0, 1.5), sharey=True)
    assert len(axes) == count and fig.axes == axes  # the grid's spare cells are gone
    rows, columns = shape
    assert tuple(fig.get_size_inches()) == pytest.approx((2.0 * columns, 1.5 * rows))
    spec = [ax.get_subplotspec() for ax in axes]
    assert [(s.rowspan.start, s.colspan.start) for s in spec] == [
        divmod(i, columns) for i in range(count)
    ]
    assert spec[0].get_gridspec().get_geometry() == shape
    for ax in axes:
        ax.plot([0, 1], [0, 1])
    assert written(fig, tmp_path, f"panels{count}")
    with pytest.raises(ValueError):  # the guard the grid exists for
        list(zip(axes, range(count + 1), strict=True))


@pytest.mark.parametrize(
    "bad, name",
    [({"count": 0}, "count"), ({"count": 2.0}, "count"), ({"count": True}, "count"),
     ({"count": 3, "per_row": 0}, "per_row")],
)  # fmt: skip
def test_panels_refuses_a_count_or_row_that_is_not_a_positive_int(bad, name):
    with pytest.raises(ValueError, match=f"{name} must be an int"):
        plots.panels(**bad)
