import math

import pytest

import zoo

pytestmark = pytest.mark.slow  # fits every family several times


@pytest.fixture(scope="module")
def mnist_small(mnist_root):
    return zoo.data.mnist(mnist_root, limit=1500), zoo.data.mnist(
        mnist_root, train=False, limit=300
    )


def test_compare_on_a_small_mnist_subset(mnist_small, tmp_path):
    train, test = mnist_small
    chart = tmp_path / "cmp.png"
    table = zoo.compare(
        zoo.models.LeNet5,
        ["diagonal", ("lowrank r=3", "lowrank", {"rank": 3}), "tridiagonal", "matrix_normal"],
        train,
        test,
        num_samples=10,
        chart=chart,
        epochs=1,
    )
    assert list(table.index) == ["diagonal", "lowrank r=3", "tridiagonal", "matrix_normal"]
    for column in (
        "parameters",
        "fit_seconds",
        "steps_per_second",
        "final_elbo",
        "accuracy",
        "nll",
        "ece",
        "brier",
    ):
        assert all(math.isfinite(v) for v in table[column]), column
    assert table.loc["tridiagonal", "parameters"] < table.loc["diagonal", "parameters"]
    assert chart.stat().st_size > 5000


def test_compare_reports_progress_per_family_only_when_asked(capsys):
    import torch

    x, y = torch.randn(40, 3), torch.randint(0, 3, (40,))

    def factory():
        return zoo.models.BayesianMLP(3, (4,), 3, task="classification")

    families = ["diagonal", ("lowrank r=2", "lowrank", {"rank": 2})]
    zoo.compare(factory, families, (x, y), (x, y), num_samples=2, num_steps=2, progress=False)
    assert capsys.readouterr().err == ""
    zoo.compare(factory, families, (x, y), (x, y), num_samples=2, num_steps=2)
    err = capsys.readouterr().err
    assert "[1/2] diagonal" in err and "[2/2] lowrank r=2" in err


def test_a_row_can_have_its_own_fit_options():
    import torch

    x, y = torch.randn(40, 3), torch.randint(0, 3, (40,))

    def factory():
        return zoo.models.BayesianMLP(3, (4,), 3, task="classification")

    rows = ["diagonal", ("MC dropout", "mc_dropout", {"p": 0.2}, {"num_steps": 3})]
    table, fits = zoo.compare(
        factory, rows, (x, y), (x, y), num_samples=2, num_steps=2, return_fits=True, progress=False
    )
    assert fits["diagonal"].steps == 2 and fits["MC dropout"].steps == 3
    with pytest.raises(ValueError, match="each entry of guides"):
        zoo.compare(factory, [("a", "diagonal", {}, {}, 5)], (x, y), (x, y), progress=False)


def test_an_empty_family_list_or_a_model_instance_is_refused_before_any_fit():
    import torch

    x, y = torch.randn(20, 3), torch.randn(20)
    factory = lambda: zoo.models.BayesianMLP(3, (4,), noise=1.0)  # noqa: E731
    with pytest.raises(ValueError, match="guides is empty"):
        zoo.compare(factory, [], (x, y), (x, y))
    with pytest.raises(TypeError, match="compare takes a model factory.*BayesianMLP"):
        zoo.compare(factory(), ["diagonal"], (x, y), (x, y), num_steps=2)
    with pytest.raises(ValueError, match="each entry of guides"):
        zoo.compare(factory, ["diagonal", ("bad",)], (x, y), (x, y), num_steps=2)


def test_a_reference_that_has_not_converged_is_flagged():
    """Two chains that sit in different places: output R-hat far above 1."""
    import torch

    from zoo.comparison import ReferenceNotConvergedWarning, warn_unconverged
    from zoo.results.hmc import Reference

    model = zoo.models.BayesianMLP(3, (4,), noise=1.0)
    g = torch.Generator().manual_seed(0)
    draws = {
        name: torch.randn(2, 50, *shape, generator=g) * 0.01
        + torch.tensor([0.0, 5.0]).reshape(2, 1, *[1] * len(shape))
        for name, shape in model.site_shapes.items()
    }
    stats = {"lp": torch.randn(2, 50, generator=g)}
    apart = Reference(model, draws, stats, 1.0, {}, torch.device("cpu"))
    x = torch.randn(10, 3, generator=g)
    with pytest.warns(ReferenceNotConvergedWarning, match="output R-hat"):
        warn_unconverged(apart, apart.predict(x, progress=False))
    mixed = Reference(model, {k: v[:, torch.randperm(50)] * 0 + v.mean((0, 1)) + 0.01 *
                              torch.randn_like(v) for k, v in draws.items()}, stats, 1.0, {},
                      torch.device("cpu"))  # fmt: skip
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unconverged(mixed, mixed.predict(x, progress=False))


def test_each_row_says_how_it_was_fitted():
    """The steps (a rate test's included), the rate and the rule beside the numbers: a
    measured row, a given rate, an ensemble's members and a Laplace approximation's MAP fit."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 3, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()

    def factory():
        return zoo.models.BayesianMLP(3, (8,), 3, task="classification")

    rows = [
        "diagonal",
        ("given", "diagonal", {}, {"lr": 0.02}),
        ("ensemble", "ensemble", {"members": 2}),
        ("laplace", "laplace", {}),
    ]
    table, fits = zoo.compare(factory, rows, (x, y), (x, y), num_samples=4, num_steps=80,
                              batch_size=32, return_fits=True, progress=False)  # fmt: skip
    phase = fits["diagonal"].options["map_start"]  # from scratch: a MAP phase, then the family
    assert table.loc["diagonal", "lr_rule"] == f"MAP start ({phase['steps']} steps)"
    assert table.loc["diagonal", "lr"] == phase["lr"] == phase["lr_test"]["lr"]
    assert (table.loc[["diagonal", "given", "laplace"], "steps"] == 80).all()
    assert table.loc["given", "lr_rule"] == "given" and table.loc["given", "lr"] == 0.02
    assert table.loc["ensemble", "steps"] == 160
    first = fits["ensemble"].members[0].options["lr_test"]  # its test, its rate shared
    assert table.loc["ensemble", "lr_rule"] == (
        f"range test ({first['steps']} steps) of the first member, given to the other 1"
    )
    assert table.loc["laplace", "lr_rule"].startswith("range test")
    assert fits["diagonal"].wall_time >= phase["seconds"] >= phase["lr_test"]["seconds"] > 0
