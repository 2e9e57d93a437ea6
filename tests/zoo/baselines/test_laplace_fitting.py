"""The Laplace baseline through laplace-torch (zoo.results.laplace_torch): the same
predictive as laplace-torch called directly on the same network, the exact posterior of a
conjugate Bayesian linear regression, plain-data saves, compare rows, and what is refused
before any work. Skipped without laplace-torch (``pip install "bnn-zoo[laplace]"``)."""

import math
import sys

import pytest
import torch
from torch import nn

import zoo
from zoo.results import laplace_torch
from zoo.storage import files

laplace = pytest.importorskip("laplace", exc_type=ImportError)


def classification(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def classifier():
    return zoo.models.BayesianMLP(3, (16,), 2, task="classification")


def direct(fit, x, y, weights, hessian, **kwargs):
    """laplace-torch on a copy of the network at the same MAP weights, fitted on the same
    data, with the zoo fit's prior precision."""
    net = laplace_torch.network_at(fit.model, fit.map_weights)
    la = laplace.Laplace(net, fit.model.likelihood.task, weights, hessian, **kwargs)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    la.fit(loader)
    la.prior_precision = fit.laplace.prior_precision.clone()
    return la


def test_the_predictive_is_laplace_torchs_on_the_same_network():
    """GLM function samples equal laplace-torch's for the same generator seed, and the probit
    predictive equals laplace-torch's closed form; both fit the prior precision by marginal
    likelihood."""
    x, y = classification()
    fit = zoo.laplace(classifier(), (x, y), num_steps=200, progress=False)
    la = direct(fit, x, y, "last_layer", "kron")
    want = la.functional_samples(x, "glm", n_samples=30, generator=torch.Generator().manual_seed(3))
    got = fit.predict(x, num_samples=30, seed=3, progress=False)
    torch.testing.assert_close(got.outputs, want)
    torch.testing.assert_close(got.probs, want.softmax(-1).mean(0))
    probit = zoo.laplace(
        classifier(), (x, y), num_steps=200, progress=False, options={"predictive": "probit"}
    )
    la = direct(probit, x, y, "last_layer", "kron")
    torch.testing.assert_close(
        probit.predict(x, progress=False).probs, la(x, pred_type="glm", link_approx="probit")
    )
    assert fit.info["prior_precision"][0] > 0 and fit.info["map_steps"] == 200


def test_full_laplace_of_a_bayesian_linear_regression_is_its_exact_posterior():
    """``y = X w + b + N(0, s^2)`` with ``w, b ~ N(0, 1 / a)``: the posterior is Gaussian with
    precision ``A = Z^T Z / s^2 + a I`` (``Z = [X, 1]``) and mean ``A^-1 Z^T y / s^2``. Centred
    there, the full Laplace approximation (GGN = the exact Hessian for a linear model) is that
    posterior, and its predictive variance of ``f(x)`` is ``z^T A^-1 z``."""
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(50, 2, generator=g)
        s, a = 0.3, 2.0
        y = x @ torch.tensor([1.5, -0.7]) + 0.2 + s * torch.randn(50, generator=g)
        z = torch.cat([x, torch.ones(50, 1)], 1)
        precision = z.T @ z / s**2 + a * torch.eye(3)
        cov = torch.linalg.inv(precision)
        mean = cov @ z.T @ y / s**2
        net = nn.Linear(2, 1)
        with torch.no_grad():
            net.weight.copy_(mean[:2].reshape(1, 2))
            net.bias.copy_(mean[2:])
        model = zoo.models.from_module(net, task="regression", noise=s, prior=a**-0.5)
        options = {"weights": "all", "hessian": "full", "prior_precision": a}
        fit = zoo.laplace(model, (x, y), at="module", options=options)
        torch.testing.assert_close(fit.laplace.posterior_covariance, cov)
        pred = fit.predict(x[:5], num_samples=20000, seed=0, progress=False)
        exact = (z[:5] @ cov * z[:5]).sum(-1)
        torch.testing.assert_close(pred.epistemic_variance, exact, rtol=0.05, atol=0)
        torch.testing.assert_close(pred.mean, z[:5] @ mean, rtol=0, atol=0.01)
        assert pred.aleatoric_variance == pytest.approx(torch.full((5,), s**2))
        sub = {**options, "weights": "subnetwork", "subnetwork_size": 3}  # every weight
        subnet = zoo.laplace(model, (x, y), at="module", options=sub)
        torch.testing.assert_close(subnet.laplace.posterior_covariance, cov)
        draws = fit.sample(20000, seed=1)  # joint weight draws: the exact posterior too
        vector = torch.cat([draws["weight"].reshape(-1, 2), draws["bias"].reshape(-1, 1)], 1)
        torch.testing.assert_close(vector.mean(0), mean, rtol=0, atol=0.01)
        torch.testing.assert_close(vector.T.cov(), cov, rtol=0.05, atol=1e-5)
    finally:
        torch.set_default_dtype(torch.float32)


def test_a_plain_data_save_loads_with_the_same_predictive(tmp_path):
    x, y = classification()
    for options in ({}, {"weights": "all", "hessian": "diag", "predictive": "nn"}):
        fit = zoo.laplace(classifier(), (x, y), num_steps=50, progress=False, options=options)
        back = zoo.load(fit.save(tmp_path / "la.pt"))
        assert isinstance(back, zoo.LaplaceFit) and back.options == fit.options
        torch.testing.assert_close(
            back.predict(x, num_samples=10, progress=False).probs,
            fit.predict(x, num_samples=10, progress=False).probs,
        )
    raw = (tmp_path / "la.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[:100])
    with pytest.raises(ValueError, match="damaged"):
        zoo.load(tmp_path / "cut.pt")


def test_a_saved_last_layer_holds_no_training_input(tmp_path):
    """laplace-torch keeps a last layer's first training minibatch (128 inputs and targets)
    to find the layer again on loading; the file holds a zero input and target of their
    shapes instead, which finds the same layer: the same predictive, no training data."""
    x, y = classification()
    fit = zoo.laplace(classifier(), (x, y), at="module", options={"weights": "last_layer"})
    held = fit.laplace.data
    assert len(held[0]) > 1  # in memory: the minibatch
    path = fit.save(tmp_path / "la.pt")
    saved = torch.load(path, weights_only=True)["state"]["data"]
    assert [tuple(t.shape) for t in saved] == [(1, *held[0].shape[1:]), (1, *held[1].shape[1:])]
    assert all(not t.any() for t in saved)
    back = zoo.load(path)
    assert fit.training_data() == back.training_data() == {}
    torch.testing.assert_close(
        back.predict(x, num_samples=10, progress=False).probs,
        fit.predict(x, num_samples=10, progress=False).probs,
    )
    payload = torch.load(path, weights_only=True)
    payload["state"]["data"] = "the training set"
    files.atomic_save(payload, path)
    with pytest.raises(ValueError, match=r"state\['data'\] is a str, not laplace-torch's"):
        zoo.load(path)


@pytest.mark.slow  # quick tier: under three minutes
def test_weight_draws_follow_the_sites_and_the_linearisation_is_laplace_torchs():
    """All weights of a 3-8-1 regression net, diagonal Hessian: :meth:`LaplaceFit.sample`
    puts laplace-torch's vector into the right sites (its mean is the MAP weights, each site's
    variance laplace-torch's posterior variance there), and the linearised network at the
    draws (:meth:`LaplaceFit.predict_draws`) has laplace-torch's GLM predictive mean and
    variance by Monte Carlo. A last layer's draws leave the body at its MAP weights."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x[:, 0] - x[:, 1] ** 2 + 0.1 * torch.randn(64, generator=g)
    model = zoo.models.BayesianMLP(3, (8,), 1, task="regression", noise=0.1)
    options = {"weights": "all", "hessian": "diag"}
    fit = zoo.laplace(model, (x, y), num_steps=300, progress=False, options=options)
    draws = fit.sample(8000, seed=0)
    assert set(draws) == set(fit.map_weights)
    variance = fit.laplace.posterior_variance
    offset = 0
    for name, w in fit.map_weights.items():
        size = w.numel()
        torch.testing.assert_close(draws[name].mean(0), w, rtol=0, atol=0.05)
        want = variance[offset : offset + size].reshape(w.shape)
        torch.testing.assert_close(draws[name].var(0), want, rtol=0.1, atol=1e-6)
        offset += size
    with laplace_torch.dependency_notices_off():
        f_mu, f_var = fit.laplace(x[:8], pred_type="glm")
    pred = fit.predict_draws(x[:8], draws)
    torch.testing.assert_close(pred.mean, f_mu.reshape(-1), rtol=0, atol=0.02)
    torch.testing.assert_close(pred.epistemic_variance, f_var.reshape(-1), rtol=0.1, atol=1e-5)

    last = zoo.laplace(model, (x, y), num_steps=300, progress=False)  # the last layer
    body = last.sample(5, seed=0)
    torch.testing.assert_close(body["fc1.weight"], last.map_weights["fc1.weight"].expand(5, 8, 3))
    assert not torch.equal(body["fc2.weight"][0], body["fc2.weight"][1])


def test_to_arviz_holds_the_weight_draws_and_their_likelihoods():
    pytest.importorskip("arviz")
    x, y = classification()
    fit = zoo.laplace(classifier(), (x, y), num_steps=100, progress=False)
    idata = fit.to_arviz((x, y), num_samples=30, seed=2)
    draws = fit.sample(30, seed=2)
    assert set(idata.posterior.data_vars) == set(draws)
    assert idata.posterior["fc2.weight"].shape == (1, 30, 2, 16)
    want = fit.predict_draws(x, draws).log_likelihood(y)
    assert idata.log_likelihood["obs"].shape == (1, 30, 128)
    assert torch.allclose(torch.from_numpy(idata.log_likelihood["obs"].values[0]), want)
    assert idata.posterior_predictive["obs"].shape == (1, 30, 128)
    assert "Laplace (last_layer, kron" in idata.attrs["inference"]
    small = fit.to_arviz(num_samples=4, var_names=["fc2.*"])
    assert set(small.posterior.data_vars) == {"fc2.weight", "fc2.bias"}


def fit_map(x, y):
    return zoo.fit(classifier(), "map", (x, y), num_steps=100, seed=0, run=zoo.Run(progress=False))


def test_a_subnetwork_laplace_is_laplace_torchs_on_the_largest_weights(tmp_path):
    """``weights="subnetwork", subnetwork_select="magnitude"`` (the baseline rule):
    laplace-torch's subnetwork Laplace over the ``S`` MAP weights of largest magnitude
    (positions in the parameter vector, checked here): laplace-torch's
    posterior and sampled-network predictive on the same network and indices; the GLM
    predictive, drawn through the linearised network, is finite where laplace-torch's own
    per-input Cholesky fails; the unchosen weights are points in the draws; a save keeps the
    indices."""
    x, y = classification()
    options = {"weights": "subnetwork", "hessian": "full", "subnetwork_size": 12,
               "prior_precision": 1.0, "subnetwork_select": "magnitude"}  # fmt: skip
    fit = zoo.laplace(classifier(), (x, y), at=fit_map(x, y), options=options)
    flat = torch.cat([fit.map_weights[n].reshape(-1) for n in classifier().site_shapes])
    want = torch.sort(flat.abs().topk(12).indices).values
    assert fit.info["subnetwork_indices"] == want.tolist()
    net = laplace_torch.network_at(fit.model, fit.map_weights)
    la = laplace.Laplace(net, "classification", "subnetwork", "full", subnetwork_indices=want,
                         prior_precision=1.0)  # fmt: skip
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128))
    torch.testing.assert_close(fit.laplace.posterior_covariance, la.posterior_covariance)
    nn_fit = zoo.laplace(classifier(), (x, y), at=fit_map(x, y), options={**options,
                         "predictive": "nn"})  # fmt: skip
    with laplace_torch.dependency_notices_off():
        direct = la.predictive_samples(x, "nn", n_samples=20,
                                       generator=torch.Generator().manual_seed(3))  # fmt: skip
    got = nn_fit.predict(x, num_samples=20, seed=3, progress=False)
    torch.testing.assert_close(got.sample_probs, direct)
    glm = fit.predict(x, num_samples=200, seed=0, progress=False)  # where laplace-torch's fails
    assert torch.isfinite(glm.outputs).all() and glm.outputs.shape == (200, 128, 2)
    draws = fit.sample(50, seed=0)
    vectors = torch.cat([draws[n].reshape(50, -1) for n in classifier().site_shapes], 1)
    moving = (vectors.std(0) > 0).nonzero().reshape(-1)
    assert moving.tolist() == want.tolist()
    back = zoo.load(fit.save(tmp_path / "sub.pt"))
    assert back.info["subnetwork_indices"] == want.tolist()
    torch.testing.assert_close(back.predict(x, num_samples=5, progress=False).probs,
                               fit.predict(x, num_samples=5, progress=False).probs)  # fmt: skip
    with pytest.raises(ValueError, match="hessian='full' only"):
        zoo.LaplaceOptions(weights="subnetwork", hessian="kron")
    with pytest.raises(ValueError, match="subnetwork_size"):
        zoo.LaplaceOptions(weights="subnetwork", hessian="full", subnetwork_size=50_000)


def test_options_are_a_group_a_mapping_or_none():
    assert zoo.LaplaceOptions.of(None) == zoo.LaplaceOptions()
    assert zoo.LaplaceOptions.of({"hessian": "diag"}).hessian == "diag"
    for bad in (5, "kron", ["hessian"]):
        with pytest.raises(TypeError, match="zoo.LaplaceOptions or a dict of its fields"):
            zoo.LaplaceOptions.of(bad)


@pytest.mark.parametrize("prior_precision", [2.0, "marglik"])
def test_the_default_subnetwork_is_the_papers_largest_variance_rule(prior_precision):
    """``weights="subnetwork"`` chooses by Daxberger et al.'s rule: the ``S`` weights of largest
    marginal variance under a diagonal Laplace of every weight at the MAP, the same positions
    as laplace-torch's own ``LargestVarianceDiagLaplaceSubnetMask`` on the same network (with
    the marginal-likelihood prior precision, the diagonal Laplace's own fitted one); not the
    largest weights."""
    from laplace.utils import LargestVarianceDiagLaplaceSubnetMask

    x, y = classification()
    at = fit_map(x, y)
    options = {"weights": "subnetwork", "hessian": "full", "subnetwork_size": 12,
               "prior_precision": prior_precision}  # fmt: skip
    fit = zoo.laplace(classifier(), (x, y), at=at, options=options)
    assert zoo.LaplaceOptions().subnetwork_select == "variance"
    net = laplace_torch.network_at(at.model, fit.map_weights)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    precision = 1.0 if prior_precision == "marglik" else prior_precision
    diag = laplace.Laplace(net, "classification", "all", "diag", prior_precision=precision)
    if prior_precision == "marglik":
        diag.fit(loader)
        with pytest.warns(UserWarning, match="link_approx"):  # laplace-torch's note
            diag.optimize_prior_precision(pred_type="glm", method="marglik")
    mask = LargestVarianceDiagLaplaceSubnetMask(net, 12, diag).get_subnet_mask(loader)
    want = mask.nonzero().reshape(-1)
    assert fit.info["subnetwork_indices"] == want.tolist()
    flat = torch.cat([fit.map_weights[n].reshape(-1) for n in classifier().site_shapes])
    largest = set(flat.abs().topk(12).indices.tolist())
    assert set(want.tolist()) != largest  # on this net the two rules differ
    with pytest.raises(ValueError, match="subnetwork_select='size'"):
        zoo.LaplaceOptions(weights="subnetwork", hessian="full", subnetwork_select="size")


def test_compare_has_laplace_rows():
    x, y = classification()
    table = zoo.compare(
        classifier,
        ["map", ("Laplace LL KFAC", "laplace", {}), ("Laplace diag", "laplace",
                                                     {"weights": "all", "hessian": "diag"})],
        (x, y), (x, y), num_steps=50, num_samples=10, progress=False,
    )  # fmt: skip
    assert math.isnan(table.loc["Laplace diag"]["final_elbo"])
    assert table.loc["Laplace diag"]["parameters"] == 2 * table.loc["map"]["parameters"]
    assert 0 <= table.loc["Laplace LL KFAC"]["accuracy"] <= 1
    with pytest.raises(ValueError, match="hessian="):
        zoo.compare(classifier, [("L", "laplace", {"hessian": "kfac"})], (x, y), (x, y))


@pytest.mark.parametrize(
    "model,options,match",
    [
        (lambda: classifier(), {"hessian": "kfac"}, "hessian='kfac'"),
        (lambda: classifier(), {"prior_precision": -1.0}, "prior_precision"),
        (lambda: classifier(), {"weights": "some"}, "weights='some'"),
        (
            lambda: zoo.models.BayesianMLP(3, (8,), 1, task="regression"),
            {"predictive": "probit"},
            "probit.*classification",
        ),
        (
            lambda: zoo.models.BayesianMLP(3, (8,), 1, task="regression", noise="heteroscedastic"),
            {},
            "heteroscedastic",
        ),
        (
            lambda: zoo.models.BayesianMLP(3, (200, 200), 2, task="classification"),
            {"weights": "all", "hessian": "full"},
            "dense",
        ),
    ],
)
def test_what_laplace_torch_cannot_do_is_refused_before_any_fit(model, options, match, monkeypatch):
    fits = []
    monkeypatch.setattr(zoo.training.fitting, "fit", lambda *a, **k: fits.append(1))
    with pytest.raises((ValueError, TypeError), match=match):
        zoo.laplace(model(), classification(), options=options, num_steps=5)
    assert fits == []


def test_without_laplace_torch_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "laplace", None)  # import laplace then fails
    with pytest.raises(ImportError, match=r'pip install "bnn-zoo\[laplace\]"'):
        zoo.laplace(classifier(), classification(), num_steps=5)
