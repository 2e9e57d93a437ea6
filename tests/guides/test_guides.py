"""The guide contract, for every family on every zoo model."""

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

import guides
import zoo
from zoo.models import BayesianMLP, CifarNet, LeNet5, from_module

GUIDES = {
    "diagonal": lambda m: guides.AutoDiagonal(m),
    "lowrank": lambda m: guides.AutoLowRank(m, rank=3),
    "lowrank_constant": lambda m: guides.AutoLowRank(m, rank=3, diagonal="constant"),
    "tridiagonal_posch": lambda m: guides.AutoTridiagonal(m),
    "tridiagonal_free": lambda m: guides.AutoTridiagonal(m, parameterization="free"),
    "matrix_normal": lambda m: guides.AutoMatrixNormal(m),
    "matrix_normal_diag": lambda m: guides.AutoMatrixNormal(m, row="diagonal", col="diagonal"),
    "mixed": lambda m: guides.AutoMixed(m, {"*.bias": "diagonal", "*": "tridiagonal"}),
}


def small_convnet():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)
    )


MODELS = {
    "mlp_regression": (lambda: BayesianMLP(3, (8,), 1, noise="learned"), (3,), "regression"),
    "mlp_classification": (lambda: BayesianMLP(3, (8,), 4, task="classification"), (3,), 4),
    "lenet5": (lambda: LeNet5(), (1, 28, 28), 10),
    "cifarnet": (lambda: CifarNet(), (3, 32, 32), 10),
    "converted": (lambda: from_module(small_convnet()), (1, 8, 8), 3),
}


def batch(spec, n=6):
    shape, target = spec[1], spec[2]
    x = torch.randn((n,) + shape)
    y = torch.randn(n) if target == "regression" else torch.randint(0, target, (n,))
    return x, y


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("guide_name", list(GUIDES))
def test_guide_contract(guide_name, model_name):
    spec = MODELS[model_name]
    model = spec[0]()
    x, y = batch(spec)
    guide = GUIDES[guide_name](model)
    sample = guide(x, y)
    latent = list(model.site_shapes) + (["noise"] if model_name == "mlp_regression" else [])
    assert sorted(sample) == sorted(latent)

    medians = guide.median()
    qs = guide.quantiles([0.05, 0.5, 0.95])
    for name in latent:
        assert medians[name].shape == sample[name].shape
        assert qs[name].shape == (3,) + sample[name].shape
        assert (qs[name][0] <= qs[name][1]).all() and (qs[name][1] <= qs[name][2]).all()
        assert torch.allclose(qs[name][1], medians[name], atol=1e-6)
        post = guide.get_posterior(name)
        assert post.sample().shape == sample[name].shape
        assert torch.isfinite(post.log_prob(post.sample())).all()
    if model_name == "mlp_regression":
        assert (medians["noise"] > 0).all() and (qs["noise"] > 0).all()

    for elbo in (Trace_ELBO(), TraceMeanField_ELBO()):
        loss = elbo.differentiable_loss(model, guide, x, y)
        loss.backward()
        assert torch.isfinite(loss)
    assert all(p.grad is not None for p in guide.parameters())

    draws = guide.sample_posterior(4)
    out = model.network(x, draws)
    assert out.shape[:2] == (4, len(x))


@pytest.mark.parametrize("guide_name", list(GUIDES))
def test_fit_predict_for_every_family(guide_name):
    spec = MODELS["mlp_classification"]
    model = spec[0]()
    x, y = batch(spec, n=64)
    fit = zoo.fit(model, GUIDES[guide_name], (x, y), epochs=3, batch_size=16, progress=False)
    assert fit.steps == 12 and all(torch.isfinite(torch.tensor(fit.losses)))
    pred = fit.predict(x[:5], num_samples=7)
    assert pred.probs.shape == (5, 4)
    assert pred.outputs.shape == (7, 5, 4)


# A 2000 x 2000 linear layer: n = 4e6 weights.
SIZE = 2000
LINEAR_COUNTS = {
    "diagonal": lambda n, i, o: 2 * n,
    "lowrank": lambda n, i, o: (3 + 2) * n,
    "tridiagonal_posch": lambda n, i, o: n + 2,
    "tridiagonal_free": lambda n, i, o: 3 * n - 1,
    "matrix_normal": lambda n, i, o: n + i * i + o * o,
}


@pytest.mark.parametrize("guide_name", list(LINEAR_COUNTS))
def test_no_dense_covariance_for_a_wide_layer(guide_name):
    model = BayesianMLP(SIZE, (), SIZE, noise=1.0)
    x, y = torch.randn(4, SIZE), torch.randn(4, SIZE)
    guide = GUIDES[guide_name](model)
    guide(x, y)
    n = SIZE * SIZE
    count = sum(p.numel() for p in guide.site_posterior("fc1.weight").parameters())
    assert count == LINEAR_COUNTS[guide_name](n, SIZE, SIZE)
    assert max(p.numel() for p in guide.parameters()) <= 3 * n  # rank 3 factor at most
    opt = torch.optim.Adam(guide.parameters(), lr=1e-3)
    loss = Trace_ELBO().differentiable_loss(model, guide, x, y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)


def test_mixed_guide_assigns_families_by_pattern():
    model = LeNet5()
    x, y = batch(MODELS["lenet5"])
    guide = guides.AutoMixed(
        model,
        {
            "fc2.weight": "matrix_normal",
            "fc1.weight": ("lowrank", {"rank": 2}),
            "conv*": ("tridiagonal", {"parameterization": "free"}),
            "*": "diagonal",
        },
    )
    guide(x, y)
    kinds = {n: type(guide.get_posterior(n)).__name__ for n in guide.site_names}
    assert kinds["fc2.weight"] == "MatrixNormal"
    assert kinds["fc1.weight"] == "LowRankNormal"
    assert kinds["conv1.weight"] == kinds["conv2.bias"] == "TridiagonalNormal"  # free
    assert kinds["fc1.bias"] == "DiagonalNormal"
    assert guide.get_posterior("fc1.weight").rank == 2


def test_mixed_guide_errors_name_the_site():
    model = LeNet5()
    x, y = batch(MODELS["lenet5"])
    with pytest.raises(ValueError, match="'fc2.bias'.*matrix_normal"):
        guides.AutoMixed(model, {"fc2.*": "matrix_normal", "*": "diagonal"})(x, y)
    with pytest.raises(ValueError, match="No pattern .* matches site 'conv1.weight'"):
        guides.AutoMixed(model, {"fc*": "diagonal"})(x, y)


@pytest.mark.parametrize(
    "family, options",
    [
        ("diagonal", ["init_scale", "init_loc"]),
        ("lowrank", ["rank", "diagonal"]),
        ("tridiagonal", ["init_rho", "init_tau", "min_abs_mean", "parameterization"]),
        ("matrix_normal", ["col", "row"]),
    ],
)
def test_a_misspelt_option_is_refused_with_the_family_options(family, options):
    model = BayesianMLP(3, (8,), 1)
    with pytest.raises(TypeError, match="got unknown option\\(s\\) \\['rnak'\\]") as err:
        guides.get(family)(model, rnak=2)
    for name in options:
        assert name in str(err.value)
    with pytest.raises(TypeError, match="AutoLowRank got unknown option"):
        guides.AutoMixed(model, {"*": ("lowrank", {"rnak": 2})})


def test_registry():
    assert guides.available() == ["diagonal", "lowrank", "matrix_normal", "tridiagonal"]
    assert guides.get("tridiagonal") is guides.AutoTridiagonal
    with pytest.raises(ValueError, match="Unknown guide family 'tri'.*'tridiagonal'"):
        guides.get("tri")


def test_init_module_sets_the_means():
    net = small_convnet()
    model = from_module(net)
    guide = guides.AutoTridiagonal(model, init_module=net)
    guide(*batch(MODELS["converted"]))
    for name, p in net.named_parameters():
        assert torch.equal(guide.median()[name], p.detach())


def test_two_guides_of_one_family_do_not_share_parameters():
    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(5, 3), torch.randn(5)
    g1, g2 = guides.AutoDiagonal(model), guides.AutoDiagonal(model)
    g1(x, y)
    g2(x, y)
    with torch.no_grad():
        g1.site_posterior("fc1.weight").loc.fill_(3.0)
    assert not torch.equal(g2.median()["fc1.weight"], g1.median()["fc1.weight"])
    assert pyro.get_param_store()  # the parameters are still visible to Pyro


def test_guide_works_with_pyro_svi():
    model = BayesianMLP(2, (4,), 1)
    x = torch.randn(50, 2)
    y = x.sum(-1)
    guide = guides.AutoTridiagonal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    first = svi.step(x, y)
    before = guide.median()["fc1.weight"].clone()
    for _ in range(50):
        last = svi.step(x, y)
    assert not torch.equal(before, guide.median()["fc1.weight"])
    assert last < first


@pytest.mark.parametrize("guide_name", list(GUIDES))
@pytest.mark.parametrize("parallel", [False, True], ids=["loop", "vectorised"])
def test_pyro_predictive_draws_from_the_guide(guide_name, parallel):
    """Pyro's own Predictive (what a Pyro user reaches for) samples every site from the guide:
    the draws' mean and spread match the guide's mean and marginal standard deviation."""
    pyro.set_rng_seed(0)
    model = BayesianMLP(3, (4,), 2, task="classification")
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    guide = GUIDES[guide_name](model)
    with torch.no_grad():
        guide(x, y)
    n = 1000
    draws = pyro.infer.Predictive(model, guide=guide, num_samples=n, parallel=parallel)(x)
    assert draws["obs"].shape == (n, 5)
    with torch.no_grad():
        for name in ("fc1.weight", "fc2.bias"):
            posterior = guide.get_posterior(name)
            w = draws[name].reshape(n, -1)
            sd = posterior.variance.reshape(-1).sqrt()
            assert torch.allclose(w.mean(0), posterior.mean.reshape(-1), atol=4 * sd.max() / n**0.5)
            assert torch.allclose(w.std(0), sd, rtol=0.1)
