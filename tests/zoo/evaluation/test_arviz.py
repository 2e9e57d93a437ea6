import numpy as np
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
    assert zaz.groups_of(idata) == {
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
    assert zaz.elpd(zaz.loo(idata))[0] < 0
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
    with pytest.raises(ValueError, match="PSIS-LOO needs at least 25 draws .* got 8"):
        zaz.loo(idata)
    zaz.plot_ppc(idata)
    small = fit.to_arviz(num_samples=8, var_names=["fc.*"])
    assert set(small.posterior.data_vars) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    with pytest.raises(ValueError, match="match no site"):
        fit.to_arviz(num_samples=2, var_names=["nope"])


# ---- either ArviZ: 0.23 on Python 3.10-3.11, 1.x on 3.12+ -----------------------------
# zoo.arviz under either ArviZ (0.23 on Python 3.10-3.11, 1.x on 3.12+): the same numbers on
# the same draws. The reference values are ArviZ 0.23.4's on these arrays (Python 3.11, the
# suite's first leg); the 3.12 leg of ``.ci/run`` checks ArviZ 1.x against them.

#: ArviZ 0.23.4 on the draws of :func:`draws` (zaz.loo, zaz.layer_summary,
#: zaz.chain_diagnostics).
REFERENCE = {
    "elpd": -35.87059079533392,
    "se": 5.152283702044917,
    "layer_sd": 0.97014276631281,
    "w_r_hat": 1.0164484010658315,
    "w_ess_bulk": 159.37640422172558,
}


def draws():
    """Two chains of 100 draws of a (3, 2) weight and a noise, and the pointwise log
    likelihood of 30 observations (a Normal of scale 0.5 around each draw's means)."""
    rng = np.random.default_rng(0)
    post = {"w": rng.normal(size=(2, 100, 3, 2)), "noise": np.abs(rng.normal(size=(2, 100))) + 0.5}
    mu = rng.normal(size=(30,))
    y = mu + rng.normal(scale=0.5, size=30)
    means = mu[None, None, :] + 0.3 * rng.normal(size=(2, 100, 30))
    log_lik = -0.5 * ((y - means) / 0.5) ** 2 - np.log(0.5 * np.sqrt(2 * np.pi))
    groups, dims = {"posterior": post}, {"w": zaz.site_dims("fc.w", (3, 2))}
    zaz.add_data_groups(groups, dims, log_lik, means, torch.as_tensor(y))
    return zaz.from_groups(groups, dims, {"inference": "test"}), post


def test_the_installed_arviz_gives_its_own_form_with_every_group():
    idata, _ = draws()
    assert zaz.groups_of(idata) == {
        "posterior", "posterior_predictive", "log_likelihood", "observed_data"
    }  # fmt: skip
    kind = "DataTree" if zaz.ARVIZ_1 else "InferenceData"
    assert type(idata).__name__ == kind
    assert idata["posterior"]["w"].dims == ("chain", "draw", "fc_out", "fc_in")


def test_loo_and_the_summaries_are_arviz_0_23s_numbers():
    """PSIS-LOO's elpd, the layer summary and R-hat / bulk ESS equal ArviZ 0.23's to float
    rounding. The elpd's standard error is ArviZ's own: 1.x takes the pointwise values'
    sample variance (``n - 1``, Vehtari et al. 2017), 0.23 their population variance, so 1.x's
    is ``sqrt(n / (n - 1))`` times 0.23's."""
    idata, post = draws()
    elpd, se = zaz.elpd(zaz.loo(idata))
    assert elpd == pytest.approx(REFERENCE["elpd"], rel=1e-10)
    n = 30
    expected_se = REFERENCE["se"] * (np.sqrt(n / (n - 1)) if zaz.ARVIZ_1 else 1.0)
    assert se == pytest.approx(expected_se, rel=1e-10)
    assert zaz.layer_summary(idata).loc["w", "sd"] == pytest.approx(REFERENCE["layer_sd"])
    chain = zaz.chain_diagnostics({"w": post["w"]})
    assert chain["w_r_hat"] == pytest.approx(REFERENCE["w_r_hat"], rel=1e-10)
    assert chain["w_ess_bulk"] == pytest.approx(REFERENCE["w_ess_bulk"], rel=1e-10)


def test_a_netcdf_round_trip_keeps_the_draws(tmp_path):
    idata, post = draws()
    back = zaz.from_netcdf(zaz.to_netcdf(idata, tmp_path / "i.nc"))
    np.testing.assert_array_equal(np.asarray(back["posterior"]["w"]), post["w"])
