"""The Laplace approximation's prior precision chosen on held-out data
(zoo.baselines.prior_search): each precision scored as a fixed-precision fit scores the same
data, the exact predictive of a conjugate linear regression, the grid, saves, compare rows,
and what is refused before any fit. Skipped without laplace-torch."""

import math
import warnings

import pytest
import torch
from torch import nn

import zoo
from tests.zoo.baselines.test_laplace_fitting import classification, classifier
from zoo.baselines import prior_search
from zoo.results.laplace_torch import LaplaceTorchError

laplace = pytest.importorskip("laplace", exc_type=ImportError)

GRID = dict(options={"prior_precision": "gridsearch"})


def test_each_precision_scores_what_a_fixed_precision_fit_scores_and_the_lowest_is_kept():
    """The search's NLL at every precision is ``evaluate``'s NLL of a fit at that fixed
    precision on the same held-out data (the same predictive, seed and draws), and the
    precision kept is the lowest's; the grid is the coarse decades, then quarter decades
    around their best."""
    train, held_out = classification(), classification(96, seed=1)
    model = classifier()
    map_fit = zoo.fit(model, "map", train, num_steps=300, run=zoo.Run(progress=False))
    fit = zoo.laplace(model, train, at=map_fit, validation=held_out, **GRID)
    search = fit.info["prior_search"]
    coarse = [10.0**k for k in range(-4, 5)]
    assert search["precisions"][:9] == pytest.approx(coarse)
    best_coarse = coarse[min(range(9), key=search["nll"].__getitem__)]
    fine = search["precisions"][9:]
    assert 1 <= len(fine) <= 6
    assert all(0.1 < p / best_coarse < 10 and p != best_coarse for p in fine)
    for precision, score in zip(search["precisions"][::3], search["nll"][::3]):
        fixed = zoo.laplace(model, train, at=map_fit, options={"prior_precision": precision})
        assert fixed.evaluate(held_out)["nll"] == pytest.approx(score, rel=1e-5)
    best = min(range(len(search["nll"])), key=search["nll"].__getitem__)
    assert fit.info["prior_precision"] == pytest.approx([search["precisions"][best]])
    assert fit.laplace.prior_precision.item() == pytest.approx(search["precisions"][best])
    assert fit.evaluate(held_out)["nll"] == pytest.approx(min(search["nll"]), rel=1e-5)


def test_a_conjugate_regression_scores_its_exact_predictive():
    """``y = X w + b + N(0, s^2)``, the full Laplace centred at fixed weights ``m``: at prior
    precision ``a`` the predictive of ``f(x)`` is ``N(z^T m, z^T A^-1 z)``, ``A = Z^T Z / s^2
    + a I`` (``Z = [X, 1]``), and of ``y`` that plus ``s^2``. The search's held-out NLL at
    each precision is that Gaussian's (up to the hundred draws' mixture), and where the
    precision matters the one kept is within a draw's noise of the exact best of the grid."""
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(6, 2, generator=g)  # few data: the prior shapes the predictive
        s = 0.5
        truth = torch.tensor([1.5, -0.7, 0.2])
        y = x @ truth[:2] + truth[2] + s * torch.randn(6, generator=g)
        xv = 3 * torch.randn(200, 2, generator=g)  # far inputs: the weights' spread matters
        yv = xv @ truth[:2] + truth[2] + s * torch.randn(200, generator=g)
        z, zv = (torch.cat([t, torch.ones(len(t), 1)], 1) for t in (x, xv))
        m = truth + 0.1 * torch.tensor([1.0, -1.0, 0.5])  # the centre: near the truth
        net = nn.Linear(2, 1)
        with torch.no_grad():
            net.weight.copy_(m[:2].reshape(1, 2))
            net.bias.copy_(m[2:])
        model = zoo.models.from_module(net, task="regression", noise=s)
        options = {"weights": "all", "hessian": "full", "prior_precision": "gridsearch"}
        fit = zoo.laplace(model, (x, y), at="module", options=options, validation=(xv, yv))
        search = fit.info["prior_search"]
        exact = []
        for a in search["precisions"]:
            cov = torch.linalg.inv(z.T @ z / s**2 + a * torch.eye(3))
            variance = (zv @ cov * zv).sum(-1) + s**2
            normal = torch.distributions.Normal(zv @ m, variance.sqrt())
            exact.append(-normal.log_prob(yv).mean().item())
        assert search["nll"] == pytest.approx(exact, rel=0.03)
        kept = search["precisions"].index(fit.info["prior_precision"][0])
        assert exact[kept] - min(exact) < 0.02
        assert max(exact) - min(exact) > 0.1  # the precision matters here ...
        assert 10 < search["precisions"][kept] < 1000  # ... and its best is inside the grid
    finally:
        torch.set_default_dtype(torch.float32)


def test_the_edge_of_the_grid_warns_and_a_failure_everywhere_is_refused(monkeypatch):
    train, held_out = classification(), classification(64, seed=1)
    model = classifier()
    map_fit = zoo.fit(model, "map", train, num_steps=50, run=zoo.Run(progress=False))
    monkeypatch.setattr(prior_search, "_held_out_nll", lambda fit, p, *a: 1 / p)
    with pytest.warns(UserWarning, match="grid's edge") as caught:
        fit = zoo.laplace(model, train, at=map_fit, validation=held_out, **GRID)
    assert [w.filename for w in caught] == [__file__]  # it points at the caller's line
    assert fit.info["prior_precision"] == pytest.approx([1e4])
    assert len(fit.info["prior_search"]["precisions"]) == 9 + 3  # the fine steps inside
    monkeypatch.setattr(prior_search, "_held_out_nll", lambda *a: math.inf)
    with pytest.raises(LaplaceTorchError, match="every precision"):
        zoo.laplace(model, train, at=map_fit, validation=held_out, **GRID)


def test_a_failing_precision_scores_inf(monkeypatch):
    x, y = classification()
    model = classifier()
    fit = zoo.laplace(model, (x, y), num_steps=50, progress=False)

    def failing(*args, **kwargs):
        raise LaplaceTorchError("no")

    monkeypatch.setattr(fit, "summarise", failing)
    options = fit.predict_options(None, seed=0, progress=False)
    assert prior_search._held_out_nll(fit, 1.0, x, y, options) == math.inf


def test_a_gridsearch_fit_saves_loads_and_is_a_compare_row(tmp_path):
    train, held_out = classification(), classification(64, seed=1)
    fit = zoo.laplace(classifier(), train, num_steps=50, progress=False, validation=held_out,
                      **GRID)  # fmt: skip
    back = zoo.load(fit.save(tmp_path / "la.pt"))
    assert back.options.prior_precision == "gridsearch"
    assert back.laplace.prior_precision.item() == pytest.approx(fit.info["prior_precision"][0])
    torch.testing.assert_close(
        back.predict(held_out[0], num_samples=10, progress=False).probs,
        fit.predict(held_out[0], num_samples=10, progress=False).probs,
    )
    row = ("held-out prior", "laplace", {"prior_precision": "gridsearch", "validation": held_out})
    table = zoo.compare(classifier, [row], train, held_out, num_steps=50, num_samples=10,
                        progress=False)  # fmt: skip
    assert 0 <= table.loc["held-out prior"]["accuracy"] <= 1


@pytest.mark.parametrize(
    "call,match",
    [
        (dict(**GRID), "pass validation="),
        (
            dict(validation=classification(8), options={"prior_precision": "marglik"}),
            "read only by prior_precision='auto' or 'gridsearch'",
        ),
        (dict(validation=(torch.randn(8, 5), torch.zeros(8).long()), **GRID), "5"),
        (dict(validation=(torch.randn(8, 3), torch.full((8,), 7)), **GRID), "label"),
        (dict(validation=(torch.randn(8, 3), torch.zeros(6).long()), **GRID), "8"),
    ],
)
def test_bad_validation_is_refused_before_any_fit(call, match, monkeypatch):
    from zoo.baselines import laplace_fitting

    fits = []
    monkeypatch.setattr(laplace_fitting, "fit", lambda *a, **k: fits.append(1))
    with pytest.raises(ValueError, match=match):
        zoo.laplace(classifier(), classification(), num_steps=5, **call)
    assert fits == []


def test_rows_and_the_subnetwork_guide_refuse_gridsearch_without_held_out_data():
    x, y = classification()
    with pytest.raises(ValueError, match="compare 'laplace' row.*pass validation="):
        zoo.compare(classifier, [("L", "laplace", {"prior_precision": "gridsearch"})], (x, y),
                    (x, y))  # fmt: skip
    row = ("L", "laplace", {"validation": (x, y), "prior_precision": 1.0})
    with pytest.raises(ValueError, match="compare 'laplace' row.*read only by"):
        zoo.compare(classifier, [row], (x, y), (x, y))
    for rule in ("gridsearch", "auto"):
        with pytest.raises(ValueError, match="no held-out data"):
            zoo.subnetwork_guide(classifier(), (x, y), 8, prior_precision=rule)


def test_auto_without_validation_is_the_grid_search_on_a_tenth_held_out_of_the_map_fit():
    """The default rule, no validation given: a tenth of the rows drawn from the fit's seed
    (the global generator untouched, laplace-torch's passes over the data too) is held out
    of the MAP fit and the curvature, and the result is the explicit grid search given those
    rows as validation and fitted on the rest; the top edge (the network's own predictive)
    is recorded, not warned about."""
    x, y = classification(400)
    kept, held = prior_search.held_out_split(400, seed=3)
    assert len(held) == 40 and len(kept) == 360
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(400))
    model, state = classifier(), torch.get_rng_state()
    auto = zoo.laplace(model, (x, y), num_steps=100, seed=3, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert auto.info["prior_rule"] == "gridsearch (on 40 rows held out of the MAP fit)"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*grid's edge", UserWarning)  # the explicit rule's
        grid = zoo.laplace(classifier(), (x[kept], y[kept]), num_steps=100, seed=3,
                           progress=False, validation=(x[held], y[held]), **GRID)  # fmt: skip
    assert auto.info["prior_search"] == grid.info["prior_search"]
    torch.testing.assert_close(auto.map_weights, grid.map_weights)  # the MAP fit's 360 rows
    torch.testing.assert_close(
        auto.predict(x[:20], num_samples=8, seed=0, progress=False).probs,
        grid.predict(x[:20], num_samples=8, seed=0, progress=False).probs,
    )
    other = prior_search.held_out_split(400, seed=4)[1]
    assert not torch.equal(other, held)


def test_auto_reads_validation_when_given_and_falls_back_on_few_rows(monkeypatch):
    train, held_out = classification(), classification(64, seed=1)
    model = classifier()
    map_fit = zoo.fit(model, "map", train, num_steps=50, run=zoo.Run(progress=False))
    auto = zoo.laplace(model, train, at=map_fit, validation=held_out)
    grid = zoo.laplace(model, train, at=map_fit, validation=held_out, **GRID)
    assert auto.info["prior_rule"] == "gridsearch (on validation)"
    assert auto.info["prior_search"] == grid.info["prior_search"]
    few = zoo.laplace(model, classification(150), at=map_fit)  # 15 rows would be held out
    assert few.info["prior_rule"] == "marglik (150 rows are too few to hold a tenth out)"
    marglik = zoo.laplace(model, classification(150), at=map_fit,
                          options={"prior_precision": "marglik"})  # fmt: skip
    assert few.info["prior_precision"] == marglik.info["prior_precision"]
    assert "prior_search" not in few.info
    monkeypatch.setattr(prior_search, "_held_out_nll", lambda fit, p, *a: 1 / p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the top edge: no warning from the default
        top = zoo.laplace(model, classification(400), at=map_fit)
    assert top.info["prior_search"]["at_edge"] and top.info["prior_precision"] == [1e4]
    monkeypatch.setattr(prior_search, "_held_out_nll", lambda fit, p, *a: p)
    with pytest.warns(UserWarning, match="grid's edge"):  # the bottom edge still warns
        zoo.laplace(model, classification(400), at=map_fit)


def test_the_default_keeps_a_trained_networks_calibration():
    """A batch-norm CNN trained by a plain Adam loop on the 8x8 digits, then made Bayesian
    post hoc with the default call: the Laplace predictive's test NLL and ECE are the
    network's within 0.01 (the marginal likelihood's precision loses both, which the test
    also shows, so it tests the rule)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    y = torch.tensor(labels)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    train, test = order[:1400], order[1400:]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(128, 10),
        )  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(10):
        for rows in train[torch.randperm(len(train), generator=g)].split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        probs = net(x[test]).softmax(-1)
    own = {"nll": zoo.metrics.nll(probs, y[test]), "ece": zoo.metrics.ece(probs, y[test])}
    model = zoo.models.from_module(net, init="module")
    fit = zoo.laplace(model, (x[train], y[train]), at="module")
    got = fit.evaluate((x[test], y[test]), num_samples=100, seed=0, progress=False)
    assert fit.info["prior_rule"] == "gridsearch (on 140 rows of the data, at the given weights)"
    assert got["nll"] <= own["nll"] + 0.01 and got["ece"] <= own["ece"] + 0.01
    marglik = zoo.laplace(model, (x[train], y[train]), at="module",
                          options={"prior_precision": "marglik"})  # fmt: skip
    old = marglik.evaluate((x[test], y[test]), num_samples=100, seed=0, progress=False)
    assert old["nll"] > own["nll"] + 0.03 and old["ece"] > own["ece"] + 0.03
