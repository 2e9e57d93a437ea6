"""zoo.inference.surrogate against Pyro's own ELBOs: the same value and gradients on the same
draws, for every family of the registry, both ELBOs, scales as numbers and as tensors, several
particles; Pyro's path for the draws it does not reduce; and the same numbers under validation."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.poutine.util import prune_subsample_sites

import guides
import zoo
from tests.families import CASES
from zoo.inference.elbo import ElboScale
from zoo.inference.objective import loss_context
from zoo.inference.surrogate import ReparamMeanField_ELBO, ReparamTrace_ELBO
from zoo.models import BayesianMLP

PAIRS = {
    "trace": (ReparamTrace_ELBO, Trace_ELBO),
    "meanfield": (ReparamMeanField_ELBO, TraceMeanField_ELBO),
}


def data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randn(
        n, 2, generator=g, dtype=torch.float64
    )


def wired(family, options, scale):
    model = BayesianMLP(3, (5,), 2, task="regression").double()
    guide = guides.get(family)(model, **options)
    x, y = data()
    with loss_context():
        guide(x, y)  # its parameters
    with torch.no_grad():  # away from the initial values, which many families share
        for p in guide.parameters():
            p.add_(
                0.1
                * torch.randn(
                    p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype
                )
            )
    return scale(model), scale(guide), [p for p in guide.parameters() if p.requires_grad]


def loss_and_grads(elbo, model, guide, params, seed=3, validate=False, **options):
    x, y = data()
    pyro.set_rng_seed(seed)
    with loss_context(validate):
        loss = elbo(max_plate_nesting=1, **options).differentiable_loss(model, guide, x, y)
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


def assert_same(a, b, rtol=1e-12):
    (value_a, grads_a), (value_b, grads_b) = a, b
    torch.testing.assert_close(value_a, value_b, rtol=rtol, atol=0.0)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        if ga is None or gb is None:
            assert ga is None and gb is None
        else:
            torch.testing.assert_close(ga, gb, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("tensor_scales", [False, True], ids=["numbers", "tensors"])
@pytest.mark.parametrize("elbo", list(PAIRS))
@pytest.mark.parametrize("case", list(CASES))
def test_the_reduction_is_pyros_elbo(case, elbo, tensor_scales):
    """Value and gradients against Pyro's ELBO on the same draws (float64, so that the two sums
    in different orders agree to 1e-12), with the likelihood at N / B = 6.25 and the KL at 0.3
    (as numbers in an eager step, as 0-d tensors in a traced graph)."""
    family, options = CASES[case]
    scale = ElboScale(6.25, 0.3)
    if tensor_scales:
        scale.data_scale = torch.tensor(6.25, dtype=torch.float64)
        scale.kl_weight = torch.tensor(0.3, dtype=torch.float64)
    model, guide, params = wired(family, options, scale)
    ours, pyros = PAIRS[elbo]
    assert_same(
        loss_and_grads(ours, model, guide, params), loss_and_grads(pyros, model, guide, params)
    )


@pytest.mark.parametrize("elbo", list(PAIRS))
def test_several_particles_vectorised_or_not_are_pyros(elbo):
    model, guide, params = wired("diagonal", {}, ElboScale(6.25, 0.3))
    ours, pyros = PAIRS[elbo]
    for options in ({"num_particles": 3}, {"num_particles": 3, "vectorize_particles": True}):
        a = loss_and_grads(ours, model, guide, params, **options)
        assert_same(a, loss_and_grads(pyros, model, guide, params, **options))


@pytest.mark.parametrize("elbo", list(PAIRS))
def test_a_validated_step_computes_the_same_bits(elbo):
    """Under Pyro's validation the traces are Pyro's (with its checks); the reduction reads the
    log-densities they computed, in the same order, so the numbers are bitwise the same."""
    model, guide, params = wired("tridiagonal", {}, ElboScale(6.25, 0.3))
    ours, _ = PAIRS[elbo]
    plain = loss_and_grads(ours, model, guide, params)
    assert_same(loss_and_grads(ours, model, guide, params, validate=True), plain, rtol=0.0)


def test_the_reduced_value_is_the_elbo_estimate_of_the_draw():
    """An independent computation: one draw's ``-ELBO`` from the traces' log-densities."""
    model, guide, params = wired("diagonal", {}, ElboScale(6.25, 0.3))
    x, y = data()
    pyro.set_rng_seed(5)
    with loss_context():
        value = ReparamTrace_ELBO(max_plate_nesting=1).differentiable_loss(model, guide, x, y)
        pyro.set_rng_seed(5)
        guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
        model_trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=guide_trace)).get_trace(
            x, y
        )
    expected = 0.0
    for name, site in prune_subsample_sites(model_trace).nodes.items():
        if site["type"] != "sample":
            continue
        log_p = site["fn"].log_prob(site["value"]).sum()
        if site["is_observed"]:
            expected += 6.25 * log_p
        else:
            expected += 0.3 * (log_p - guide_trace.nodes[name]["fn"].log_prob(site["value"]).sum())
    torch.testing.assert_close(value, -expected, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("validate", [False, True])
def test_a_kl_without_closed_form_is_estimated_by_monte_carlo(validate):
    """A Student-t guide against a Normal prior has no registered KL: the mean-field ELBO falls
    back to ``log p - log q`` at the draw, as Pyro's does."""

    def model(y):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    loc = torch.tensor(0.3, requires_grad=True)

    def guide(y):
        pyro.sample("z", dist.StudentT(5.0, loc, 0.7))

    y = torch.randn(8, generator=torch.Generator().manual_seed(0))
    results = []
    for elbo in PAIRS["meanfield"]:
        pyro.set_rng_seed(1)
        with pyro.validation_enabled(validate):
            loss = elbo(max_plate_nesting=1).differentiable_loss(model, guide, y)
        results.append((loss.detach(), torch.autograd.grad(loss, [loc])))
    assert_same(*results, rtol=1e-6)


@pytest.mark.parametrize("validate", [False, True])
def test_draws_it_does_not_reduce_take_pyros_path(validate):
    """A guide site without ``rsample`` (a score-function term) and a masked site: Pyro's own
    reduction, the same value (the ELBO estimate, not the surrogate's) and gradients."""

    def model(y):
        p = pyro.sample("p", dist.Beta(2.0, 2.0))
        k = pyro.sample("k", dist.Bernoulli(p))
        with pyro.plate("data", len(y)), pyro.poutine.mask(mask=y > -1.0):
            pyro.sample("y", dist.Normal(k, 1.0), obs=y)

    a = torch.tensor(1.5, requires_grad=True)
    b = torch.tensor(0.2, requires_grad=True)

    def guide(y):
        pyro.sample("p", dist.Beta(a.exp(), 2.0))
        pyro.sample("k", dist.Bernoulli(logits=b))

    y = torch.linspace(-2.0, 2.0, 9)
    results = []
    for elbo in PAIRS["trace"]:
        pyro.set_rng_seed(2)
        with pyro.validation_enabled(validate):
            loss = elbo(max_plate_nesting=1).differentiable_loss(model, guide, y)
        results.append((loss.detach(), torch.autograd.grad(loss, [a, b])))
    assert_same(*results, rtol=1e-6)


def test_a_latent_the_guide_does_not_draw_adds_its_log_density_as_pyros_does():
    """A latent site of the model that the guide does not sample: its ``log p`` is added."""

    def model(y):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        u = pyro.sample("u", dist.Normal(z, 1.0))  # drawn by the model in both traces
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(z + u, 1.0), obs=y)

    loc = torch.tensor(0.3, requires_grad=True)

    def guide(y):
        pyro.sample("z", dist.Normal(loc, 0.7))

    y = torch.linspace(-1.0, 1.0, 5)
    results = []
    for elbo in PAIRS["trace"]:  # (Pyro's mean-field ELBO needs every latent in the guide)
        pyro.set_rng_seed(4)
        with pyro.validation_enabled(False):  # validated, Pyro warns of such a site
            loss = elbo(max_plate_nesting=1).differentiable_loss(model, guide, y)
        results.append((loss.detach(), torch.autograd.grad(loss, [loc])))
    assert_same(*results, rtol=1e-6)


@pytest.mark.parametrize("elbo", list(PAIRS))
@pytest.mark.parametrize(
    "family, estimator",
    [("diagonal", "local"), ("diagonal", "flipout"), ("matrix_normal", "local"),
     ("mc_dropout", "local"), ("map", "local")],
)  # fmt: skip
def test_the_estimators_losses_are_pyros(family, estimator, elbo):
    """Under the local reparameterisation and flipout handlers (``zoo.inference.estimators``)
    too."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, generator=g), torch.randint(0, 3, (16,), generator=g)
    model = BayesianMLP(3, (8,), 3, task="classification")
    objective = zoo.Objective(model, guides.get(family)(model), estimator=estimator, elbo=elbo)
    objective.setup(x, y)
    objective.scale.data_scale, objective.scale.kl_weight = 6.25, 0.3
    params = [p for p in objective.guide.parameters() if p.requires_grad]
    results = []
    for cls in PAIRS[elbo]:
        pyro.set_rng_seed(1)
        with loss_context():
            loss = cls(max_plate_nesting=1).differentiable_loss(*objective.wired, x, y)
        results.append((loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)))
    assert_same(*results, rtol=1e-5)
