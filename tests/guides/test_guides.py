"""The guide contract, for every family (from the registry) on every zoo model.

The shared tests take ``make_guide`` (``model -> guide``); a module that defines a family of its
own imports them and overrides that fixture."""

import functools
import gc
import weakref

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

import guides
import zoo
from tests.families import CASES, PRIMARY
from zoo.models import BayesianMLP, CifarNet, LeNet5, from_module

GUIDES = {
    **{label: (family, options) for label, (family, options) in CASES.items()},
    "mixed": (guides.AutoMixed, {"families": {"*.bias": "diagonal", "*": "tridiagonal"}}),
}


def build(label: str, model):
    family, options = GUIDES[label]
    cls = guides.get(family) if isinstance(family, str) else family
    return cls(model, **options)


@pytest.fixture(params=list(GUIDES))
def make_guide(request):
    """``make_guide(model)``: a guide of the case under test."""
    return functools.partial(build, request.param)


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
def test_guide_contract(make_guide, model_name):
    spec = MODELS[model_name]
    model = spec[0]()
    x, y = batch(spec)
    guide = make_guide(model)
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


def test_fit_predict_for_every_family(make_guide):
    spec = MODELS["mlp_classification"]
    model = spec[0]()
    x, y = batch(spec, n=64)
    fit = zoo.fit(
        model,
        make_guide,
        (x, y),
        epochs=3,
        batch_size=16,
        run=zoo.Run(progress=False),
    )
    assert fit.steps == 12 and all(torch.isfinite(torch.tensor(fit.losses)))
    pred = fit.predict(x[:5], num_samples=7)
    assert pred.probs.shape == (5, 4)
    assert pred.outputs.shape == (7, 5, 4)


# A 1000 x 1000 linear layer: n = 1e6 weights (a dense covariance would have 1e12 entries).
SIZE = 1000
#: Exact parameter counts of a weight site for the built-in families (default options).
LINEAR_COUNTS = {
    "diagonal": lambda n, i, o: 2 * n,
    "lowrank": lambda n, i, o: (10 + 2) * n,
    "tridiagonal": lambda n, i, o: n + 2,
    "tridiagonal_free": lambda n, i, o: 3 * n - 1,
    "matrix_normal": lambda n, i, o: n + i * i + o * o,
    "block_diagonal": lambda n, i, o: n + -(-n // 16) * (16 + 16 * 15 // 2),
    "block_diagonal_block2": lambda n, i, o: n + -(-n // 2) * (2 + 1),
    "mc_dropout": lambda n, i, o: n,
    "mc_dropout_p05": lambda n, i, o: n,
    "map": lambda n, i, o: n,
    # D = 1024 (the next power of two of 1000), one block: mu, d, L's strict lower triangle,
    # S1 (a number per row) and S2 (per column)
    # blocks of 4 (the default): K = (o / 4) (i / 4) blocks of 4 means, 4 scales and a unit
    # triangle of 6; S1 per row, S2 per column of each of the o / 4 rows of blocks
    "whvi": lambda n, i, o: (-(-o // 4) * -(-i // 4)) * (2 * 4 + 6) + o + -(-o // 4) * i,
    "whvi_diagonal": lambda n, i, o: (-(-o // 4) * -(-i // 4)) * 2 * 4 + o + -(-o // 4) * i,
    "whvi_paper": lambda n, i, o: 2 * 1024 + 1024 * 1023 // 2 + o + i,  # one block of 1,024
}


@pytest.mark.parametrize("guide_name", list(CASES))
def test_no_dense_covariance_for_a_wide_layer(guide_name):
    model = BayesianMLP(SIZE, (), SIZE, noise=1.0)
    x, y = torch.randn(4, SIZE), torch.randn(4, SIZE)
    guide = build(guide_name, model)
    guide(x, y)
    n = SIZE * SIZE
    count = sum(p.numel() for p in guide.site_posterior("fc1.weight").parameters())
    if guide_name in LINEAR_COUNTS:
        assert count == LINEAR_COUNTS[guide_name](n, SIZE, SIZE)
    assert count <= 12 * n  # O(n) parameters: never an n x n matrix
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
    with pytest.raises(ValueError, match="No pattern .* matches site 'conv1.weight'"):
        guides.AutoMixed(model, {"fc*": "diagonal"})(x, y)


def test_one_rule_for_sites_a_family_cannot_serve():
    """Biases under the matrix normal get the diagonal family, whether the family is the guide
    or a pattern of AutoMixed; a family without a fallback refuses the site by name."""
    model = LeNet5()
    x, y = batch(MODELS["lenet5"])
    whole = guides.AutoMatrixNormal(model, row="diagonal")
    mixed = guides.AutoMixed(model, {"*": ("matrix_normal", {"row": "diagonal"})})
    for guide in (whole, mixed):
        guide(x, y)
        assert type(guide.get_posterior("fc2.bias")).__name__ == "DiagonalNormal"
        assert type(guide.get_posterior("fc2.weight")).__name__ == "MatrixNormal"
    site_cls = guides.AutoMatrixNormal.site_class
    with pytest.raises(ValueError, match="'fc2.bias' of shape \\(10,\\)"):
        guides.base.serving_class(
            type("Strict", (site_cls,), {"fallback": None}), "fc2.bias", (10,), "strict"
        )


@pytest.mark.parametrize(
    "family, options",
    [
        ("diagonal", ["init_scale", "init_loc_fn"]),
        ("lowrank", ["rank", "diagonal"]),
        ("tridiagonal", ["init_rho", "init_tau", "min_abs_mean", "parameterization"]),
        ("matrix_normal", ["col", "row"]),
        ("block_diagonal", ["block_size"]),
        ("mc_dropout", ["p", "sigma"]),
        ("map", []),
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
    assert guides.available() == [
        "block_diagonal",
        "diagonal",
        "lowrank",
        "map",
        "matrix_normal",
        "mc_dropout",
        "subnetwork",
        "tridiagonal",
        "whvi",
    ]
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


def test_two_fits_of_one_family_do_not_share_parameters():
    """zoo's own functions never use Pyro's global param store."""
    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(5, 3), torch.randn(5)
    a = zoo.fit(model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False), seed=1)
    b = zoo.fit(model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False), seed=2)
    with torch.no_grad():
        a.guide.site_posterior("fc1.weight").loc.fill_(3.0)
    assert not torch.equal(b.guide.median()["fc1.weight"], a.guide.median()["fc1.weight"])
    zoo.predict(model, b.guide, x, num_samples=2, progress=False)
    assert len(pyro.get_param_store()) == 0


def test_two_live_guides_of_one_family_keep_their_own_parameters():
    """Unlike two AutoNormals, a second live guide of one class gets its own names in Pyro's
    store (the first free suffix), so neither takes the other's values."""
    gc.collect()  # guides that earlier tests left in reference cycles (their tracebacks)
    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(5, 3), torch.randn(5)
    g1, g2 = guides.AutoDiagonal(model), guides.AutoDiagonal(model)
    g1(x, y)
    g2(x, y)
    store = pyro.get_param_store()
    assert "AutoDiagonal.sites.fc1.weight.loc" in store
    assert "AutoDiagonal_1.sites.fc1.weight.loc" in store
    with torch.no_grad():
        g1.site_posterior("fc1.weight").loc.fill_(3.0)
    assert not torch.equal(g2.median()["fc1.weight"], g1.median()["fc1.weight"])
    del g1
    assert guides.AutoDiagonal(model)._pyro_name == "AutoDiagonal"  # the name is free again


@pytest.fixture
def no_cycle_collector():
    """The cycle collector off for the test (on again after it, as it was)."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


@pytest.mark.parametrize("label", sorted(PRIMARY))
def test_a_dropped_fit_frees_its_guide_at_once(label, no_cycle_collector):
    """Guides and fit results (compiled loss included) hold no reference cycles: dropping the
    result frees the guide, its parameters and optimiser state at once, without the cycle
    collector, and a new guide of the family gets the name again."""
    family, options = PRIMARY[label]
    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(16, 3), torch.randn(16)
    fit = zoo.fit(
        model, guides.family(family, **options), (x, y), num_steps=4, batch_size=8, seed=0,
        run=zoo.Run(progress=False),
    )  # fmt: skip
    assert fit.options["jit"] == "compiled"
    fit.predict(x, num_samples=2)
    ref, name = weakref.ref(fit.guide), fit.guide._pyro_name
    del fit
    assert ref() is None
    assert guides.get(family)(model, **options)._pyro_name == name


def test_a_diverged_fit_caught_by_the_caller_frees_its_guide(no_cycle_collector):
    """``FitDivergedError.result`` holds the fit; once the caller lets the error go, nothing
    (no frame of the library in its traceback) keeps it alive."""
    x, y = torch.randn(20, 2), torch.randn(20)
    refs = []

    def poison(state):
        if state.step == 3:
            x[0, 0] = float("nan")

    def caller():
        try:
            zoo.fit(BayesianMLP(2, (3,), 1), "diagonal", (x, y), num_steps=10, batch_size=20,
                    run=zoo.Run(progress=False, callbacks=[poison]))  # fmt: skip
        except zoo.FitDivergedError as err:
            refs.append(weakref.ref(err.result.guide))

    caller()
    assert len(refs) == 1 and refs[0]() is None


def test_pyro_param_store_save_and_load_restore_a_guide(tmp_path):
    """Pyro's workflow: save the param store, build a new guide of the same model in a fresh
    session, load the store: the new guide's first call takes the saved values."""
    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(20, 3), torch.randn(20)
    guide = guides.AutoTridiagonal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(5):
        svi.step(x, y)
    pyro.get_param_store().save(tmp_path / "params.pt")
    trained = guide.median()
    del guide, svi  # a new session holds no earlier guide
    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "params.pt")
    fresh = guides.AutoTridiagonal(model)
    fresh(x, y)
    for name, value in fresh.median().items():
        assert torch.equal(value, trained[name]), name


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


#: The diagonal family in the quick tier, every family in the full suite (Monte Carlo: slow).
PREDICTIVE_CASES = [
    pytest.param(label, marks=() if label == "diagonal" else pytest.mark.slow) for label in GUIDES
]


@pytest.mark.parametrize("label", PREDICTIVE_CASES)
@pytest.mark.parametrize("parallel", [False, True], ids=["loop", "vectorised"])
def test_pyro_predictive_draws_from_the_guide(label, parallel):
    """Pyro's own Predictive (what a Pyro user reaches for) samples every site from the guide:
    the draws' mean and spread match the guide's mean and marginal standard deviation."""
    pyro.set_rng_seed(0)
    model = BayesianMLP(3, (4,), 2, task="classification")
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    guide = build(label, model)
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


def test_pyro_init_loc_fn_is_accepted_and_the_old_name_is_refused():
    from pyro.infer.autoguide import init_to_median

    model = BayesianMLP(3, (4,), 1)
    x, y = torch.randn(5, 3), torch.randn(5)
    guide = guides.AutoLowRank(model, init_loc_fn=init_to_median)
    guide(x, y)
    assert torch.allclose(guide.median()["fc1.weight"], torch.zeros(4, 3), atol=0.2)
    with pytest.raises(TypeError, match="unknown option.*init_loc.*init_loc_fn"):
        guides.AutoDiagonal(model, init_loc=init_to_median)


def test_mixed_refuses_unknown_options_and_patterns_that_match_no_site():
    model = BayesianMLP(3, (4,), 2, task="classification")
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    with pytest.raises(TypeError, match="init_scal"):
        guides.AutoMixed(model, {"*": "diagonal"}, init_scal=0.5)
    with pytest.raises(TypeError, match="init_scal.*init_scale"):
        guides.AutoJoint(model, init_scal=0.5)  # the base's options, declared once, still checked
    assert guides.AutoJoint(model, init_scale=0.2, init_loc_fn="kaiming").init_scale == 0.2
    with pytest.raises(ValueError, match="patterns \\['fc2.weigth'\\] match no site"):
        guides.AutoMixed(model, {"fc2.weigth": "lowrank", "*": "diagonal"})(x, y)
    for composite in guides.registry.composites() + ["subnetwork"]:
        with pytest.raises(ValueError, match=f"maps to '{composite}', a family over several"):
            guides.AutoMixed(model, {"*": composite})
    assert guides.AutoMixed.__doc__ and "pattern" in guides.AutoMixed.__doc__


def test_a_guide_that_was_never_run_says_so():
    guide = guides.AutoDiagonal(BayesianMLP(3, (4,), 1))
    for call in (guide.median, lambda: guide.quantiles([0.5]), lambda: guide.sample_posterior(2)):
        with pytest.raises(RuntimeError, match="has not been run yet"):
            call()


def test_a_stale_param_store_entry_of_another_shape_is_refused_clearly():
    """A guide called directly (Pyro's way) keeps its parameters in Pyro's global store; a later
    guide of the same class, built after the first was dropped, takes its name. With another
    shape its first call is refused, saying what to do; zoo.fit, which never reads the store,
    fits it; the same shape is Pyro's own resume and is kept."""
    import gc

    import pyro

    import zoo

    pyro.clear_param_store()
    try:
        x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)
        first = guides.AutoDiagonal(zoo.models.BayesianMLP(3, (4,), 2, task="classification"))
        first(x, y)
        del first
        gc.collect()
        wider = zoo.models.BayesianMLP(3, (8,), 2, task="classification")
        with pytest.raises(ValueError, match=r"param store holds 'AutoDiagonal\.sites\.fc1.*"
                                             r"pyro\.clear_param_store\(\)"):  # fmt: skip
            guides.AutoDiagonal(wider)(x, y)
        fit = zoo.fit(wider, "diagonal", (x, y), num_steps=2, run=zoo.Run(progress=False))
        assert fit.guide.site_posterior("fc1.weight").loc.shape == (8, 3)
        same = guides.AutoDiagonal(zoo.models.BayesianMLP(3, (4,), 2, task="classification"))
        same(x, y)  # the same shapes: Pyro's resume from the store, as documented
    finally:
        pyro.clear_param_store()


def test_a_recipe_says_why_without_figures_that_go_stale():
    """A recipe's ``why`` gives the reason and the benchmark that shows it; its measured
    figures live in the benchmark's results, which are rerun, not in the code."""
    import re

    for name in guides.available():
        why = guides.recipe(name).why
        assert not re.search(r"\d\.\d|\d+ nats|\d+%", why), (name, why)
