import warnings

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import JitTrace_ELBO, Trace_ELBO
from pyro.poutine.util import site_is_subsample
from torch import nn

import guides
import zoo
from tests.families import CASES
from zoo.models import BayesianMLP, CifarNet, LeNet5, from_module
from zoo.priors import LayerwiseNormalPrior, NormalPrior, ScaleMixturePrior

MODELS = {
    "mlp_regression": (lambda: BayesianMLP(3, (8, 8), 1), (3,), "regression"),
    "mlp_heteroscedastic": (
        lambda: BayesianMLP(3, (8,), 1, noise="heteroscedastic"),
        (3,),
        "regression",
    ),
    "mlp_classification": (lambda: BayesianMLP(3, (8,), 4, task="classification"), (3,), 4),
    "lenet5": (lambda: LeNet5(), (1, 28, 28), 10),
    "cifarnet": (lambda: CifarNet(), (3, 32, 32), 10),
    "converted": (
        lambda: from_module(
            nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)),
            init="module",
        ),
        (1, 8, 8),
        3,
    ),
}


def data_for(spec, n):
    x = torch.randn((n,) + spec[1])
    if spec[2] == "regression":
        return x, torch.randn(n)
    return x, torch.randint(0, spec[2], (n,))


@pytest.mark.parametrize("name", list(MODELS))
def test_batched_forward_equals_a_loop_over_samples(name):
    spec = MODELS[name]
    model = spec[0]()
    x, _ = data_for(spec, 5)
    draws = {
        site: torch.randn((8,) + tuple(shape)) * 0.1 for site, shape in model.site_shapes.items()
    }
    batched = model.network(x, draws)
    looped = torch.stack([model.network(x, {k: v[s] for k, v in draws.items()}) for s in range(8)])
    assert batched.shape[:2] == (8, 5)
    assert torch.allclose(batched, looped, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_sites_are_named_after_layers_and_fit_lowers_the_loss(name):
    spec = MODELS[name]
    model = spec[0]()
    trace = poutine.trace(model).get_trace(*data_for(spec, 4))
    latent = [n for n, s in trace.iter_stochastic_nodes() if not site_is_subsample(s)]
    noise = ["noise"] if getattr(model.likelihood, "learned", False) else []  # regression default
    assert latent == list(model.site_shapes) + noise
    assert all(n.endswith((".weight", ".bias")) for n in model.site_shapes)
    assert trace.nodes["obs"]["cond_indep_stack"][0].name == "data"

    x, y = data_for(spec, 32)
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=60,
        batch_size=32,
        lr=0.02,
        run=zoo.Run(progress=False),
    )
    losses = torch.tensor(fit.losses)
    assert losses[-10:].mean() < losses[:10].mean()


def test_lenet_and_cifarnet_architectures():
    assert {n: tuple(s) for n, s in LeNet5(hidden=250).site_shapes.items()} == {
        "conv1.weight": (20, 1, 5, 5),
        "conv1.bias": (20,),
        "conv2.weight": (50, 20, 5, 5),
        "conv2.bias": (50,),
        "fc1.weight": (250, 800),
        "fc1.bias": (250,),
        "fc2.weight": (10, 250),
        "fc2.bias": (10,),
    }
    shapes = CifarNet().site_shapes
    assert tuple(shapes["conv3.weight"]) == (64, 32, 5, 5)
    assert tuple(shapes["fc1.weight"]) == (10, 1024)


@pytest.mark.parametrize(
    "prior", [NormalPrior(0.5), LayerwiseNormalPrior(2.0), ScaleMixturePrior()], ids=type
)
def test_priors_follow_the_model_dtype_and_device(prior):
    model = BayesianMLP(3, (4,), 1, prior=prior).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    trace = poutine.trace(model).get_trace(x, y)
    for name in model.site_shapes:
        site = trace.nodes[name]
        assert site["value"].dtype == torch.float64
        assert site["fn"].event_shape == model.site_shapes[name]
        assert torch.isfinite(site["fn"].log_prob(site["value"]))


def test_layerwise_prior_scale():
    model = BayesianMLP(100, (10,), 1, prior=LayerwiseNormalPrior(1.0))
    d = model.prior.distribution(model.site_shapes["fc1.bias"], model._fan_in["fc1.bias"])
    assert torch.allclose(d.scale, torch.tensor(0.1))


def test_scale_mixture_log_prob():
    d = zoo.priors.ScaleMixtureNormal(torch.tensor(0.3), torch.tensor(1.0), torch.tensor(0.1))
    v = torch.tensor([0.0, 0.5, -2.0])
    normal = torch.distributions.Normal
    expected = torch.log(
        0.3 * normal(0, 1.0).log_prob(v).exp() + 0.7 * normal(0, 0.1).log_prob(v).exp()
    )
    assert torch.allclose(d.log_prob(v), expected)
    assert abs(d.sample((200_000,)).var().item() - d.variance.item()) < 0.01


def test_learned_noise_site_and_prediction():
    model = BayesianMLP(2, (4,), 1, noise="learned")
    x, y = torch.randn(30, 2), torch.randn(30)
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=5,
        batch_size=30,
        run=zoo.Run(progress=False),
    )
    assert "noise" in fit.guide.site_names
    pred = fit.predict(x, num_samples=9)
    assert pred.sample_scales.shape == (9, 30) and (pred.sample_scales > 0).all()
    assert torch.allclose(pred.variance, pred.epistemic_variance + pred.aleatoric_variance)
    pyro.clear_param_store()


@pytest.mark.parametrize("shape", [(4, 3, 24, 24), (2, 5, 3, 8, 8), (3, 2, 7, 9)])
def test_lenet_pooling_equals_max_pool2d(shape):
    """MaxPool2x2's strided-view path (no autograd, CPU) equals nn.MaxPool2d(2), odd sizes and
    leading dimensions included, NaN propagated; with autograd it is max_pool2d itself."""
    from zoo.models.lenet import MaxPool2x2

    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x[(0,) * (len(shape) - 2) + (1, 2)] = float("nan")
    flat = x.reshape(-1, *shape[-3:])
    pooled_hw = (shape[-2] // 2, shape[-1] // 2)
    expected = nn.functional.max_pool2d(flat, 2).reshape(*shape[:-2], *pooled_hw)
    with torch.no_grad():
        got = MaxPool2x2()(x)
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)
    batched = torch.func.vmap(MaxPool2x2())(x.reshape(-1, *shape[-3:])[None])
    torch.testing.assert_close(batched[0].reshape(got.shape), got, equal_nan=True)

    y = torch.randn(flat.shape, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(nn.functional.max_pool2d(y, 2).shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad(MaxPool2x2()(y), y, upstream)
    (want,) = torch.autograd.grad(nn.functional.max_pool2d(y, 2), y, upstream)
    torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("case", list(CASES))
def test_pyros_jit_elbo_runs_on_zoo_models_and_matches_the_eager_elbo(case):
    """Pyro's ``JitTrace_ELBO`` traces the model with ``torch.jit.trace``, under which
    ``functional_call`` refuses to run; the model swaps its weights in instead. The compiled
    loss and its gradients (``loss_and_grads``, the route of Pyro's ``SVI``) equal the eager
    ``Trace_ELBO``'s for the same draws, for every family."""
    family, options = CASES[case]
    model = BayesianMLP(3, (6,), 2, task="classification")
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    guide = guides.get(family)(model, **options)
    with torch.no_grad():
        guide(x, y)
    params, own = list(guide.parameters()), list(model.net.parameters())
    jit = JitTrace_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values in the graph
        jit.loss_and_grads(model, guide, x, y)  # compiles
        for p in params:
            p.grad = None
        pyro.set_rng_seed(1)
        compiled = jit.loss_and_grads(model, guide, x, y)
    compiled_grads = [p.grad.clone() for p in params]
    pyro.set_rng_seed(1)
    eager = Trace_ELBO(max_plate_nesting=1).differentiable_loss(model, guide, x, y)
    eager_grads = torch.autograd.grad(eager, params)
    assert compiled == pytest.approx(eager.item(), rel=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(a is b for a, b in zip(own, model.net.parameters()))  # its own weights are back


@pytest.mark.parametrize(
    "build, phrase",
    [
        (lambda: zoo.models.LeNet5(hidden=0), "LeNet-5's hidden and num_classes must be whole"),
        (lambda: zoo.models.LeNet5(hidden=2.5), "must be whole numbers"),
        (lambda: zoo.models.BayesianMLP(3, hidden=(0,)), "must be whole numbers of at least 1"),
        (lambda: zoo.models.BayesianMLP(3, hidden=(-5,)), "must be whole numbers of at least 1"),
        (lambda: zoo.models.BayesianMLP(3, hidden=(10**6, 10**6)), "GiB to fit"),
    ],
    ids=["lenet-0", "lenet-float", "mlp-0", "mlp-negative", "mlp-huge"],
)
def test_layer_sizes_no_network_can_have_are_refused_before_allocation(build, phrase):
    with pytest.raises(ValueError, match=phrase):
        build()


def test_hidden_as_a_number_is_refused_with_the_form_to_use():
    with pytest.raises(TypeError, match="hidden must be a sequence of widths, e.g. \\(100,\\)"):
        zoo.models.BayesianMLP(3, hidden=100)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BayesianMLP(3, (8,), 1, task="regression", noise=0.5),
        lambda: BayesianMLP(3, (8,), 1, task="regression", noise="learned"),
        lambda: BayesianMLP(3, (8,), 4, task="classification", prior="hierarchical"),
    ],
    ids=["fixed noise", "learned noise", "classes, hierarchical prior"],
)
def test_vectorised_particles_count_each_example_once_per_particle(make):
    """Weights drawn in a plate around the model (Pyro's vectorised ELBO particles, dim -2)
    give a likelihood of batch ``(P, B)`` whose row ``p`` is the model's log-likelihood at
    particle ``p``'s weights alone: the data counted once per particle (it was ``(P, P, B)``,
    which made ``num_particles=P`` count the data ``P`` times)."""
    model = make()
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    y = torch.randn(6) if model.task == "regression" else torch.randint(0, 4, (6,))
    guide = guides.AutoDiagonal(model)
    guide(x, y)
    plate = pyro.plate("num_particles_vectorized", 5, dim=-2)
    drawn = poutine.trace(plate(guide)).get_trace(x, y)
    run = poutine.trace(poutine.replay(plate(model), trace=drawn)).get_trace(x, y)
    log_lik = run.nodes["obs"]["fn"].log_prob(y)
    assert log_lik.shape == (5, 6)
    latent = [n for n, s in drawn.nodes.items() if s["type"] == "sample"]
    for p in range(5):
        draw = {n: drawn.nodes[n]["value"][p, 0] for n in latent}
        alone = poutine.trace(poutine.condition(model, data=draw)).get_trace(x, y)
        torch.testing.assert_close(log_lik[p], alone.nodes["obs"]["fn"].log_prob(y))
