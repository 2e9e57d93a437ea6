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
