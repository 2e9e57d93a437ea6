import torch

from zoo import plots
from zoo.prediction import RegressionPrediction


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
