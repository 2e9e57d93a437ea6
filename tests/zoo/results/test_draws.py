"""Files of draws made elsewhere (zoo.results.draws): saved and loaded as plain data, every entry
checked against the model before a posterior is built from it."""

import math

import pytest
import torch

import zoo
from zoo.storage import files


def model():
    return zoo.models.BayesianMLP(3, (4,), 1, noise=0.5)


@pytest.fixture
def saved(tmp_path):
    m = model()
    g = torch.Generator().manual_seed(0)
    draws = {n: torch.randn(2, 5, *s, generator=g) for n, s in m.site_shapes.items()}
    path = zoo.from_draws(m, draws, chains=True, label="given").save(tmp_path / "draws.pt")
    return path


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda p: p["draws"].pop("fc1.weight"), "missing"),
        (lambda p: p["draws"].__setitem__("fc1.weight", torch.zeros(2, 5, 9)), "do not fit"),
        (lambda p: p["draws"].__setitem__("fc1.bias", torch.zeros(3, 5, 4)), "draw counts"),
        (lambda p: p["draws"]["fc1.bias"].fill_(math.nan), "NaN or infinite"),
        (lambda p: p["draws"].__setitem__("fc1.bias", torch.zeros(4)), "not \\(chains"),
        (lambda p: p.pop("wall_time"), "wall_time"),
        (lambda p: p.__setitem__("options", "given"), "options entry is a str, not a mapping"),
        (
            lambda p: p.__setitem__("wall_time", "3 s"),
            "wall_time entry is a str, not a non-negative",
        ),
        (lambda p: p.__setitem__("wall_time", torch.tensor(3.0)), "wall_time entry is a Tensor"),
        (lambda p: p.__setitem__("wall_time", -1.0), "wall_time entry is -1.0, not a non-negative"),
        (lambda p: p["model"].__setitem__("spec", "BayesianMLP"), "model.spec entry is a str"),
        (lambda p: p.__setitem__("model", [1]), "model entry is a list"),
        (
            lambda p: p.__setitem__("draws", {k: v[:, :0] for k, v in p["draws"].items()}),
            "holds no draws",
        ),
    ],
)
def test_a_changed_draws_file_is_refused_naming_the_entry(saved, change, phrase):
    payload = torch.load(saved, weights_only=True)
    change(payload)
    files.atomic_save(payload, saved)  # the checksum recomputed: the checks see the contents
    with pytest.raises(ValueError, match=phrase) as err:
        zoo.load(saved)
    assert str(saved) in str(err.value)


def test_a_draws_file_loads_as_it_was(saved):
    back = zoo.load(saved)
    assert isinstance(back, zoo.Draws) and back.shape == (2, 5)
    assert back.options["label"] == "given"


def test_numpy_draws_of_any_precision_take_the_models_dtype():
    import numpy as np

    m = model()
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float16):
        draws = {n: rng.standard_normal((4, *s)).astype(dtype) for n, s in m.site_shapes.items()}
        given = zoo.from_draws(m, draws)
        assert all(v.dtype == torch.float32 for v in given.draws.values())
        pred = given.predict(torch.randn(6, 3), progress=False)
        assert pred.mean.shape == (6,) and torch.isfinite(pred.mean).all()
    double = zoo.models.BayesianMLP(3, (4,), 1, noise=0.5).double()
    draws = {n: np.zeros((2, *s), dtype=np.float32) for n, s in double.site_shapes.items()}
    assert zoo.from_draws(double, draws).draws["fc1.weight"].dtype == torch.float64


def test_using_very_many_draws_by_default_says_so():
    from zoo.results.draws import MANY_DRAWS

    m = zoo.models.BayesianMLP(1, (1,), 1, noise=0.5)
    n = MANY_DRAWS + 1
    given = zoo.from_draws(m, {k: torch.zeros(n, *s) for k, s in m.site_shapes.items()})
    with pytest.warns(UserWarning, match=f"using all {n:,} draws.*num_samples="):
        given.predict(torch.zeros(2, 1), progress=False)
    given.predict(torch.zeros(2, 1), num_samples=10, progress=False)  # asked for: no warning
