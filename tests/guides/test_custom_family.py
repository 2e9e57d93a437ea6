"""A family defined here, in a few dozen lines, runs through the shared tests with no other edit.

The isotropic Gaussian ``q(w) = N(m, s^2 I)`` per site has one scale per site, declared as a
*constrained* ``PyroParam`` (``constraints.positive``): the route ``zoo.fit`` uses must read it
exactly as Pyro's ``SVI`` does. The family registers itself by its class statement (inside a
fixture, so that it is unregistered afterwards and the rest of the suite sees only the built-in
families); the shared distribution and guide-contract tests are imported and run on it through
the ``make`` and ``make_guide`` fixtures.
"""

import functools

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.nn import PyroParam
from torch.distributions import constraints

import guides
import zoo
from guides.gaussian import DiagonalNormal
from tests.guides.conftest import make_site
from tests.guides.test_distributions import (  # noqa: F401  (collected and run here)
    test_closed_form_kl_matches_monte_carlo,
    test_empirical_covariance_of_samples,
    test_gradients_reach_every_parameter,
    test_kl_broadcasts_over_particles,
    test_log_prob_at_the_mean_tensor_is_exact,
    test_log_prob_matches_dense_mvn,
    test_log_prob_of_own_sample_has_the_exact_gradient,
    test_moments_and_entropy_match_dense,
)
from tests.guides.test_guides import (  # noqa: F401
    test_fit_predict_for_every_family,
    test_guide_contract,
    test_pyro_predictive_draws_from_the_guide,
)
from zoo.models import BayesianMLP


def define_isotropic_family():
    """The whole family: a site class and a guide class that names itself."""

    class IsotropicSite(guides.SitePosterior):
        family = "isotropic"

        def __init__(self, init_loc, init_scale):
            super().__init__(init_loc, init_scale)
            self.loc = PyroParam(init_loc.detach().clone())
            self.scale = PyroParam(
                torch.tensor(float(init_scale)).to(init_loc), constraint=constraints.positive
            )

        def distribution(self):
            base = dist.Normal(self.loc, self.scale.expand(self.loc.shape))
            return DiagonalNormal(base, self.loc.dim())

    class AutoIsotropic(guides.PerSiteGuide, family="isotropic"):
        """``N(m, s^2 I)`` per site: one standard deviation ``s`` per site."""

        site_class = IsotropicSite

    return AutoIsotropic


@pytest.fixture(scope="module")
def isotropic():
    cls = define_isotropic_family()
    yield cls
    guides.registry.unregister("isotropic")


@pytest.fixture
def make(isotropic):
    return functools.partial(make_site, None, site_cls=isotropic.site_class)


@pytest.fixture
def make_guide(isotropic):
    return isotropic


def test_the_family_is_registered_by_its_class_statement(isotropic):
    assert guides.get("isotropic") is isotropic
    assert "isotropic" in guides.available()


def data(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] > 0).long()


def test_fit_by_name_mixed_and_save_load(isotropic, tmp_path):
    model = BayesianMLP(3, (6,), 2, task="classification")
    fit = zoo.fit(
        model,
        "isotropic",
        data(),
        num_steps=20,
        lr=0.05,
        run=zoo.Run(progress=False),
    )
    loaded = zoo.load(fit.save(tmp_path / "fit.pt"))
    assert type(loaded.guide) is isotropic
    for name, value in fit.guide.median().items():
        assert torch.equal(loaded.guide.median()[name], value)
    scale = loaded.guide.site_posterior("fc1.weight").scale
    assert scale.shape == () and scale > 0
    mixed = guides.AutoMixed(model, {"fc2.*": "isotropic", "*": "diagonal"})
    fit = zoo.fit(
        model,
        mixed,
        data(),
        num_steps=5,
        run=zoo.Run(progress=False),
    )
    kinds = {n: type(fit.guide.site_posterior(n)).__name__ for n in fit.guide.site_names}
    assert kinds["fc2.weight"] == "IsotropicSite" and kinds["fc1.weight"] == "DiagonalSite"
    reloaded = zoo.load(fit.save(tmp_path / "mixed.pt"))
    assert type(reloaded.guide.site_posterior("fc2.bias")).__name__ == "IsotropicSite"


def test_zoo_route_and_pyro_svi_read_constrained_parameters_alike(isotropic):
    """The loss and gradients of zoo.Objective (parameters read directly) equal Pyro's
    Trace_ELBO under its usual param statements, for a fixed seed; the scale is its
    constrained value on both routes (a direct read of the unconstrained tensor would differ)."""
    model = BayesianMLP(3, (6,), 2, task="classification")
    x, y = data()
    guide = isotropic(model, init_scale=0.5)
    objective = zoo.Objective(model, guide)
    objective.setup(x, y)
    params = list(guide.parameters())
    for seed in range(3):
        pyro.set_rng_seed(seed)
        ours = objective.loss(x, y, num_data=len(x))
        ours_grads = torch.autograd.grad(ours, params)
        pyro.set_rng_seed(seed)
        pyro.clear_param_store()
        theirs = Trace_ELBO(max_plate_nesting=1).differentiable_loss(model, guide, x, y)
        theirs_grads = torch.autograd.grad(theirs, params)
        torch.testing.assert_close(ours, theirs)
        for a, b in zip(ours_grads, theirs_grads):
            torch.testing.assert_close(a, b)


def test_zoo_fit_and_pyro_svi_reach_the_same_posterior(isotropic):
    """Plain SGD from the same start on the same draws: zoo.fit's loop and Pyro's SVI take the
    same steps, so both end at the same posterior (constrained scale included)."""
    model = BayesianMLP(3, (6,), 2, task="classification")
    x, y = data()
    pyro.set_rng_seed(3)
    ours, theirs = isotropic(model, init_scale=0.3), isotropic(model, init_scale=0.3)
    with torch.no_grad():
        ours(x, y)
        theirs(x, y)
        for (_, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
            b.copy_(a)
    pyro.set_rng_seed(4)
    zoo.fit(
        model,
        ours,
        (x, y),
        num_steps=15,
        batch_size=len(x),
        optim=zoo.Optim(optimizer="sgd", optimizer_options={"foreach": False}),
        run=zoo.Run(progress=False),
        lr=1e-3,
        seed=None,
    )
    pyro.set_rng_seed(4)
    torch.randint(2**31, ())  # fit with seed=None draws its shuffling seed first
    svi = SVI(model, theirs, pyro.optim.SGD({"lr": 1e-3}), Trace_ELBO(max_plate_nesting=1))
    for _ in range(15):
        svi.step(x, y)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    scale = ours.site_posterior("fc1.weight").scale
    assert scale != 0.3 and torch.allclose(scale, theirs.site_posterior("fc1.weight").scale)


def test_a_family_declares_its_recipe_and_fit_uses_it():
    """``RECIPE = guides.Recipe(lr_scale=3)`` on the class: ``zoo.fit`` with no ``lr`` runs at 3
    times the task's default rate (the minibatch default here; the full-batch recipe's for
    small regression data, through the same ``resolve_length``); a given ``lr`` is kept;
    ``guides.recipe`` reads it from a name, the class, a spec and an instance, and a guide of
    another library gets the default."""
    from pyro.infer.autoguide import AutoNormal

    from zoo.training.recipes import DEFAULT_LR, REGRESSION_FIT, resolve_length

    class AutoFast(guides.AutoDiagonal, family="fast_diagonal"):
        RECIPE = guides.Recipe(lr_scale=3.0, why="a test")

    try:
        model = BayesianMLP(1, (4,), 1, task="regression", noise=0.1)
        x, y = zoo.data.toy_regression(n=32)
        quiet = zoo.Run(progress=False)
        classifier = BayesianMLP(1, (4,), 2, task="classification")
        labels = (y > 0).long()
        short = zoo.fit(classifier, "fast_diagonal", (x, labels), num_steps=2, run=quiet)
        assert short.options["lr"] == pytest.approx(3 * DEFAULT_LR)
        given = zoo.fit(model, AutoFast(model), (x, y), num_steps=2, lr=0.05, run=quiet)
        assert given.options["lr"] == pytest.approx(0.05)
        plain = zoo.fit(classifier, "diagonal", (x, labels), num_steps=2, run=quiet)
        assert plain.options["lr"] == pytest.approx(DEFAULT_LR * guides.recipe("diagonal").lr_scale)
        small = zoo.fit(model, "fast_diagonal", (x, y), num_steps=2, run=quiet)
        assert small.options["lr"] == pytest.approx(3 * REGRESSION_FIT["lr"])  # at any length
        full = resolve_length((x, y), model, epochs=None, num_steps=None, batch_size=None,
                              lr=None, lr_schedule=None, recipe=AutoFast.RECIPE)  # fmt: skip
        assert full.lr == pytest.approx(3 * REGRESSION_FIT["lr"]) and full.num_steps == 3000
        for form in ("fast_diagonal", AutoFast, guides.family("fast_diagonal"), AutoFast(model)):
            assert guides.recipe(form).lr_scale == 3.0
        assert guides.recipe(AutoNormal(model)) == guides.Recipe()
        with pytest.raises(ValueError, match="lr_scale"):
            guides.Recipe(lr_scale=0)
    finally:
        guides.registry.unregister("fast_diagonal")


def test_a_recipe_may_scale_the_full_batch_rate_apart():
    """``Recipe(full_batch_lr_scale=...)``: small regression data's full batches run at
    ``REGRESSION_FIT``'s rate times it, their minibatches at that rate times ``lr_scale``, any
    other fit at the task's rate times ``lr_scale``."""
    from zoo.training.recipes import DEFAULT_LR, REGRESSION_FIT

    class AutoSplit(guides.AutoDiagonal, family="split_diagonal"):
        RECIPE = guides.Recipe(lr_scale=2.0, full_batch_lr_scale=0.5, why="a test")

    try:
        model = BayesianMLP(1, (4,), 1, task="regression", noise=0.1)
        x, y = zoo.data.toy_regression(n=32)
        quiet = zoo.Run(progress=False)
        rule = zoo.Convergence(window=5, cap=10)  # the full-batch recipe's rate, 10 steps
        full = zoo.fit(model, "split_diagonal", (x, y), num_steps=rule, run=quiet)
        assert full.options["recipe"].startswith("small regression data")
        assert full.options["lr"] == pytest.approx(0.5 * REGRESSION_FIT["lr"])
        steps = zoo.fit(model, "split_diagonal", (x, y), num_steps=2, run=quiet)
        assert steps.options["lr"] == pytest.approx(0.5 * REGRESSION_FIT["lr"])  # full batch
        minibatch = zoo.fit(model, "split_diagonal", (x, y), num_steps=2, batch_size=8, run=quiet)
        assert minibatch.options["lr"] == pytest.approx(2.0 * REGRESSION_FIT["lr"])
        classifier = BayesianMLP(1, (4,), 2, task="classification")
        other = zoo.fit(classifier, "split_diagonal", (x, (y > 0).long()), num_steps=2, run=quiet)
        assert other.options["lr"] == pytest.approx(2.0 * DEFAULT_LR)
        assert guides.recipe("split_diagonal").scale(full_batch=True) == 0.5
        assert guides.Recipe(lr_scale=2.0).scale(full_batch=True) == 2.0
        with pytest.raises(ValueError, match="full_batch_lr_scale"):
            guides.Recipe(full_batch_lr_scale=-1)
    finally:
        guides.registry.unregister("split_diagonal")
