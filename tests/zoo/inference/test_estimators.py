"""Local reparameterisation and Flipout: exact per-example distributions, unbiased ELBO and
gradients (against the closed-form ELBO of a linear-Gaussian model), and fit's checks."""

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

import guides
import zoo
from guides.families.diagonal import DiagonalSite
from guides.families.matrix_normal import MatrixNormalSite
from tests.zoo.linear_gaussian import (
    correlated_data,
    exact_elbo,
    exact_elbo_tensor,
    guide_gaussian,
    model_for,
)
from zoo.inference.estimators import LayerNoise, plan, wire
from zoo.priors import ScaleMixturePrior

CASES = [
    ("diagonal", "local"),
    ("diagonal", "flipout"),
    ("matrix_normal", "local"),
]


def perturbed_guide(family, model, x, y, seed=0):
    """A guide with random (not initial) parameters, so every term of the ELBO matters."""
    torch.manual_seed(seed)
    guide = guides.get(family)(model, init_scale=0.3)
    guide(x, y)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return guide


@pytest.mark.parametrize(
    "family,estimator,elbo",
    [(f, e, "trace") for f, e in CASES]
    + [(f, e, "meanfield") for f, e in CASES]
    + [("diagonal", "reparam", "trace")],
)
@pytest.mark.slow  # quick tier: under three minutes
def test_elbo_and_gradient_are_unbiased(family, estimator, elbo):
    """Mean of 1,000 loss estimates and gradients = the closed-form ELBO and its gradient,
    with the wiring zoo.fit uses (including weights left undrawn where the KL is closed-form)."""
    x, y = correlated_data(n=200, d=3)
    model = model_for(3)
    guide = perturbed_guide(family, model, x, y)
    params = list(guide.parameters())
    mean, cov = guide_gaussian(guide)

    def exact():  # closed-form -ELBO as a function of the guide parameters
        w, b = guide.get_posterior("fc1.weight"), guide.get_posterior("fc1.bias")
        m = torch.cat([w.mean.reshape(-1), b.mean.reshape(-1)])
        c = torch.block_diag(w.covariance_matrix, b.covariance_matrix)
        return -exact_elbo_tensor(x, y, m, c)

    target = exact()
    target_grad = torch.autograd.grad(target, params)
    assert math.isclose(-target.item(), exact_elbo(x, y, mean, cov), rel_tol=1e-10)

    skip = plan(model, guide, estimator, elbo, x, y)[1] if estimator != "reparam" else set()
    run_model, run_guide = wire(model, guide, estimator, frozenset(skip))
    loss_fn = (Trace_ELBO() if elbo == "trace" else TraceMeanField_ELBO()).differentiable_loss
    pyro.set_rng_seed(1)
    losses, grads = [], []
    for _ in range(1000):
        loss = loss_fn(run_model, run_guide, x, y)
        losses.append(loss.detach())
        grads.append(torch.autograd.grad(loss, params))
    losses = torch.stack(losses)
    assert abs(losses.mean() - target) < 4 * losses.std() / math.sqrt(len(losses))
    for i, g_exact in enumerate(target_grad):
        g = torch.stack([gr[i] for gr in grads])
        stderr = g.std(0) / math.sqrt(len(g)) + 1e-9
        z = ((g.mean(0) - g_exact) / stderr).abs()
        assert z.max() < 5, (i, z.max())
    if estimator != "reparam":
        assert run_model.served == {"fc1.weight"}


def _outputs_under(estimator, fn, x, draws, layer="linear", **conv):
    """``draws`` outputs of one layer with weight posterior ``fn`` under ``estimator``."""
    outs = []
    for _ in range(draws):
        value = fn.rsample()
        mode = LayerNoise(estimator, {"w": (fn, value)})
        with mode:
            out = F.linear(x, value) if layer == "linear" else F.conv2d(x, value, **conv)
        assert mode.served == {"w"}
        outs.append(out)
    return torch.stack(outs)


@pytest.mark.parametrize("family,estimator", CASES)
def test_each_example_gets_the_exact_output_distribution(family, estimator):
    """Per-example mean and covariance of W x under the estimator equal those of a shared draw
    (from the dense covariance of vec W); examples are decorrelated."""
    torch.manual_seed(0)
    loc = torch.randn(3, 4, dtype=torch.float64)
    site_cls = {"diagonal": DiagonalSite, "matrix_normal": MatrixNormalSite}[family]
    site = site_cls(loc, 0.5)
    with torch.no_grad():
        for p in site.parameters():
            p.add_(0.3 * torch.randn_like(p))
    fn = site.distribution()
    x = torch.randn(2, 4, dtype=torch.float64)
    x = torch.cat([x, x[:1]])  # the third example repeats the first
    # 2,000 draws of a batch holding the three examples 20 times: 40,000 outputs per example
    outs = _outputs_under(estimator, fn, x.repeat(20, 1), 2000).reshape(-1, 3, 3)
    sigma = fn.covariance_matrix  # Cov(vec W), row-major
    for n in range(3):
        kron = torch.kron(torch.eye(3, dtype=torch.float64), x[n : n + 1])  # W x = kron vec W
        mean_ref, cov_ref = kron @ fn.mean.reshape(-1), kron @ sigma @ kron.T
        scale = cov_ref.diag().max().item()
        assert torch.allclose(outs[:, n].mean(0), mean_ref, atol=0.03 * math.sqrt(scale))
        assert (torch.cov(outs[:, n].T) - cov_ref).abs().max() < 0.05 * scale
    # the same input in two rows of a batch gets uncorrelated noise
    dev0 = outs[:, 0] - outs[:, 0].mean(0)
    dev2 = outs[:, 2] - outs[:, 2].mean(0)
    corr = (dev0 * dev2).mean(0) / (dev0.std(0) * dev2.std(0))
    assert corr.abs().max() < 0.05


def test_flipout_convolution_has_the_exact_marginals():
    torch.manual_seed(0)
    site = DiagonalSite(torch.randn(2, 3, 3, 3, dtype=torch.float64), 0.4)
    fn = site.distribution()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    outs = _outputs_under("flipout", fn, x.repeat(10, 1, 1, 1), 2000, layer="conv", padding=1)
    outs = outs.reshape(-1, 2, *outs.shape[2:])  # (draws x 10 copies, 2 examples, ...)
    mean_ref = F.conv2d(x, fn.mean, padding=1)
    var_ref = F.conv2d(x.pow(2), fn.variance, padding=1)  # independent weights
    assert torch.allclose(outs.mean(0), mean_ref, atol=0.05 * var_ref.max().sqrt().item())
    assert ((outs.var(0) - var_ref).abs() / var_ref).max() < 0.1


def test_fit_with_estimators_checks_and_records():
    x = torch.randn(64, 5)
    y = (x[:, 0] > 0).long()
    model = zoo.models.BayesianMLP(5, (8,), 2, task="classification")
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=3,
        run=zoo.Run(progress=False),
        loss=zoo.Loss(estimator="flipout"),
    )
    assert fit.options["estimator_sites"] == ["fc1.weight", "fc2.weight"]
    with pytest.raises(ValueError, match="estimator must be one of"):
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=1,
            run=zoo.Run(progress=False),
            loss=zoo.Loss(estimator="lrt"),
        )
    with pytest.raises(ValueError, match="num_particles=1"):
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=1,
            run=zoo.Run(progress=False),
            loss=zoo.Loss(estimator="local", num_particles=4),
        )
    with pytest.raises(ValueError, match="serves no weight"):
        zoo.fit(
            model,
            "lowrank",
            (x, y),
            num_steps=1,
            run=zoo.Run(progress=False),
            loss=zoo.Loss(estimator="local"),
        )
    conv = zoo.models.LeNet5()
    xi, yi = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    fit = zoo.fit(
        conv,
        "diagonal",
        (xi, yi),
        num_steps=1,
        run=zoo.Run(progress=False),
        loss=zoo.Loss(estimator="local"),
    )
    assert fit.options["estimator_sites"] == ["fc1.weight", "fc2.weight"]  # not the convs


def test_weights_are_not_drawn_only_when_the_kl_is_closed_form():
    x = torch.randn(16, 5)
    y = (x[:, 0] > 0).long()
    model = zoo.models.BayesianMLP(5, (8,), 2, task="classification")
    guide = guides.AutoDiagonal(model)
    guide(x, y)
    served, skip = plan(model, guide, "local", "meanfield", x, y)
    assert served == skip == {"fc1.weight", "fc2.weight"}
    assert plan(model, guide, "local", "trace", x, y)[1] == set()
    assert plan(model, guide, "flipout", "meanfield", x, y) == (served, set())  # needs dW
    mixture = zoo.models.BayesianMLP(5, (8,), 2, task="classification", prior=ScaleMixturePrior())
    guide = guides.AutoDiagonal(mixture)
    guide(x, y)
    assert plan(mixture, guide, "local", "meanfield", x, y)[1] == set()


@pytest.mark.parametrize("family", ["diagonal", "matrix_normal"])
@pytest.mark.slow  # quick tier: under three minutes
def test_meanfield_local_fit_reaches_the_exact_elbo_optimum_region(family):
    """Trained with local reparameterisation and a closed-form KL (weights never drawn), the
    fit's ELBO comes within 1 nat of the same family fitted with plain reparameterisation."""
    x, y = correlated_data(n=500, d=3)
    elbos = {}
    for estimator in ("reparam", "local"):
        model = model_for(3)
        fit = zoo.fit(
            model,
            family,
            (x, y),
            num_steps=800,
            batch_size=100,
            lr=0.02,
            run=zoo.Run(progress=False),
            loss=zoo.Loss(elbo="meanfield", estimator=estimator),
            optim=zoo.Optim(lr_schedule=lambda i: 0.998**i),
        )
        elbos[estimator] = exact_elbo(x, y, *guide_gaussian(fit.guide))
    assert abs(elbos["local"] - elbos["reparam"]) < 1.0, elbos


def test_auto_serves_the_linear_layers_where_the_local_product_is_cheaper():
    """The matrix normal's own default (guides.Recipe): the closed-form KL and the local
    reparameterisation where rows (out^2 + in^2) < out in (out + in), a draw elsewhere."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
    model = zoo.models.BayesianMLP(64, (128,), 10, task="classification")
    quiet = zoo.Run(progress=False)
    fit = zoo.fit(model, "matrix_normal", (x, y), num_steps=2, batch_size=16, run=quiet)
    assert (fit.options["elbo"], fit.options["estimator"]) == ("meanfield", "auto")
    # fc1: 16 (128^2 + 64^2) < 128 64 (128 + 64); fc2: 16 (10^2 + 128^2) > 10 128 (10 + 128)
    assert fit.options["estimator_sites"] == ["fc1.weight"]
    big = zoo.fit(model, "matrix_normal", (x, y), num_steps=2, batch_size=256, run=quiet)
    assert big.options["estimator_sites"] == []  # 256 rows: a draw is cheaper everywhere
    assert big.options["elbo"] == "trace"  # no layer left undrawn: the Monte Carlo KL
    particles = zoo.fit(model, "matrix_normal", (x, y), num_steps=2, batch_size=16, run=quiet,
                        loss=zoo.Loss(num_particles=3))  # fmt: skip
    assert particles.options["estimator_sites"] == []  # several particles: a draw each
    assert particles.options["elbo"] == "trace"
    closed = zoo.fit(model, "matrix_normal", (x, y), num_steps=2, batch_size=256, run=quiet,
                     loss=zoo.Loss(elbo="meanfield"))  # fmt: skip
    assert closed.options["elbo"] == "meanfield"  # given: kept though nothing is served
    given = zoo.fit(model, "matrix_normal", (x, y), num_steps=2, batch_size=16, run=quiet,
                    loss=zoo.Loss(elbo="trace", estimator="reparam"))  # fmt: skip
    assert (given.options["elbo"], given.options["estimator"]) == ("trace", "reparam")
    diagonal = zoo.fit(model, "diagonal", (x, y), num_steps=2, batch_size=16, run=quiet)
    assert (diagonal.options["elbo"], diagonal.options["estimator"]) == ("trace", "reparam")
    with pytest.raises(ValueError, match="Recipe\\(estimator='lrt'\\)"):
        guides.Recipe(estimator="lrt")


def test_auto_plans_by_the_sites_cost_and_leaves_served_weights_undrawn():
    """plan() under "auto" serves a site exactly where its family says the local product is
    cheaper for the minibatch, and with the closed-form KL leaves it undrawn (the wiring of
    "local", whose unbiasedness test_elbo_and_gradient_are_unbiased checks)."""
    x, y = correlated_data(n=200, d=3)
    model = model_for(3)
    guide = perturbed_guide("matrix_normal", model, x, y)
    site = guide.get_posterior("fc1.weight")
    rows = site.rows * site.rows + site.cols * site.cols
    assert site.local_is_cheaper(1) == (rows < site.rows * site.cols * (site.rows + site.cols))
    for rows in (1, 1000):
        served, skip = plan(model, guide, "auto", "meanfield", x, y, rows=rows)
        assert served == skip == ({"fc1.weight"} if site.local_is_cheaper(rows) else set())


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_auto_draws_mc_dropouts_masks_per_example_as_local_does(layer):
    """MC dropout prefers the local estimator on every layer (a mask per example, as dropout
    trains): under "auto" a linear or convolution layer gives exactly "local"'s output from the
    same generator state, and repeated examples of a batch get their own masks."""
    from guides.families.mc_dropout import MCDropoutWeight

    torch.manual_seed(0)
    shape = (4, 6) if layer == "linear" else (4, 6, 3, 3)
    fn = MCDropoutWeight(torch.randn(shape, dtype=torch.float64), p=0.5, sigma=1e-3)
    x = torch.randn(1, *((6,) if layer == "linear" else (6, 5, 5)), dtype=torch.float64)
    x = x.repeat(64, *([1] * (x.dim() - 1)))  # one example, 64 times
    value = fn.rsample()
    outs = {}
    for estimator in ("local", "auto"):
        torch.manual_seed(1)
        mode = LayerNoise(estimator, {"w": (fn, value)})
        with mode:
            out = F.linear(x, value) if layer == "linear" else F.conv2d(x, value, padding=1)
        assert mode.served == {"w"}
        outs[estimator] = out
    assert torch.equal(outs["auto"], outs["local"])
    distinct = torch.unique(outs["auto"].reshape(64, -1).round(decimals=6), dim=0)
    assert len(distinct) > 16  # masks per example: 2^6 patterns, not one shared


def test_mc_dropouts_default_fit_serves_every_layer_with_a_mask_per_example():
    """MC dropout's recipe: "auto" serves each convolution and linear weight of a LeNet-5; a
    given "reparam", or several particles, keep one mask per step (nothing served)."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    model = zoo.models.LeNet5()
    quiet = zoo.Run(progress=False)
    fit = zoo.fit(model, "mc_dropout", (x, y), num_steps=2, batch_size=32, run=quiet)
    assert (fit.options["elbo"], fit.options["estimator"]) == ("trace", "auto")
    weights = sorted(n for n, s in model.site_shapes.items() if len(s) >= 2)
    assert fit.options["estimator_sites"] == weights
    assert any(len(model.site_shapes[n]) == 4 for n in weights)  # convolutions among them
    shared = zoo.fit(model, "mc_dropout", (x, y), num_steps=2, batch_size=32, run=quiet,
                     loss=zoo.Loss(estimator="reparam"))  # fmt: skip
    assert (shared.options["estimator"], shared.options["estimator_sites"]) == ("reparam", [])
    particles = zoo.fit(model, "mc_dropout", (x, y), num_steps=2, batch_size=32, run=quiet,
                        loss=zoo.Loss(num_particles=2))  # fmt: skip
    assert particles.options["estimator_sites"] == []
