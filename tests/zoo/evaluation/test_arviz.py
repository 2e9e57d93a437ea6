import pyro.poutine as poutine
import pytest
import torch

import zoo
import zoo.arviz as zaz
from zoo.models import BayesianMLP, LeNet5


@pytest.fixture(scope="module")
def mlp_fit():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g)
    y = x.sum(-1) + 0.3 * torch.randn(60, generator=g)
    fit = zoo.fit(
        BayesianMLP(3, (6,), 1, noise="learned"),
        "tridiagonal",
        (x, y),
        num_steps=200,
        batch_size=60,
        lr=0.02,
        run=zoo.Run(progress=False),
    )
    return fit, x, y


def test_groups_dims_and_attrs(mlp_fit):
    fit, x, y = mlp_fit
    idata = fit.to_arviz((x, y), num_samples=40)
    assert set(idata.groups()) == {
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
    }
    w = idata.posterior["fc1.weight"]
    assert w.dims == ("chain", "draw", "fc1_out", "fc1_in") and w.shape == (1, 40, 6, 3)
    assert idata.posterior["noise"].shape == (1, 40)
    assert idata.log_likelihood["obs"].shape == (1, 40, 60)
    assert idata.posterior_predictive["obs"].shape == (1, 40, 60)
    assert idata.attrs["guide"] == "AutoTridiagonal" and idata.attrs["steps"] == 200
    assert idata.attrs["final_elbo"] == pytest.approx(-fit.losses[-1])


def test_log_likelihood_equals_the_models_own_log_prob(mlp_fit):
    fit, x, y = mlp_fit
    idata = fit.to_arviz((x, y), num_samples=5)
    for s in range(5):
        draw = {
            name: torch.as_tensor(idata.posterior[name].values[0, s])
            for name in fit.guide.site_names
        }
        trace = poutine.trace(poutine.condition(fit.model, data=draw)).get_trace(x, y)
        trace.compute_log_prob()
        expected = trace.nodes["obs"]["log_prob"]
        got = torch.as_tensor(idata.log_likelihood["obs"].values[0, s])
        assert torch.allclose(got, expected, atol=1e-5)


def test_summary_loo_and_plots_run(mlp_fit, tmp_path):
    fit, x, y = mlp_fit
    idata = fit.to_arviz((x, y), num_samples=50)
    table = zaz.summary(idata, var_names=["noise", "fc2.bias"])
    assert {"mean", "sd"} <= set(table.columns)
    assert zaz.loo(idata).elpd_loo < 0
    assert zaz.layer_summary(idata).loc["fc1.weight", "size"] == 18
    for fig in (zaz.plot_ppc(idata), zaz.plot_posterior(idata, ["fc2.bias"])):
        fig.savefig(tmp_path / "f.png")
        assert (tmp_path / "f.png").stat().st_size > 1000
    zaz.to_netcdf(idata, tmp_path / "i.nc")
    assert (tmp_path / "i.nc").stat().st_size > 1000


def test_lenet_inference_data():
    x = torch.randn(12, 1, 28, 28)
    y = torch.randint(0, 10, (12,))
    fit = zoo.fit(
        LeNet5(),
        "matrix_normal",
        (x, y),
        num_steps=2,
        run=zoo.Run(progress=False),
    )
    idata = fit.to_arviz((x, y), num_samples=8)
    assert idata.posterior["conv2.weight"].dims[2:] == (
        "conv2_out",
        "conv2_in",
        "conv2_kh",
        "conv2_kw",
    )
    assert idata.log_likelihood["obs"].shape == (1, 8, 12)
    assert set(idata.posterior_predictive["obs"].values.ravel().tolist()) <= set(range(10))
    zaz.loo(idata)
    zaz.plot_ppc(idata)
    small = fit.to_arviz(num_samples=8, var_names=["fc.*"])
    assert set(small.posterior.data_vars) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    with pytest.raises(ValueError, match="match no site"):
        fit.to_arviz(num_samples=2, var_names=["nope"])
