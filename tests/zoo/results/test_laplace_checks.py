"""Hostile Laplace, ensemble and fit files (zoo.results.laplace_checks, the readers of
zoo.results): each changed entry, its checksum recomputed as an attacker who knows the format
would, is refused with a ValueError naming the file and the entry, before laplace-torch or a
fit sees it; and laplace-torch's exit() on a curvature it cannot decompose is an error, not
the end of the process."""

import math

import pytest
import torch

import zoo
from zoo.results.laplace_torch import LaplaceTorchError
from zoo.storage import files

pytest.importorskip("laplace")


def classification(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] > 0).long()


def classifier():
    return zoo.models.BayesianMLP(3, (6,), 2, task="classification")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Bytes of a last-layer KFAC Laplace file, a full-Hessian subnetwork one, an ensemble and
    a fit."""
    folder = tmp_path_factory.mktemp("files")
    data = classification()
    kron = zoo.laplace(classifier(), data, num_steps=30, progress=False)
    sub = zoo.laplace(classifier(), data, num_steps=30, progress=False,
                      options={"weights": "subnetwork", "hessian": "full",
                               "subnetwork_size": 10})  # fmt: skip
    ens = zoo.ensemble(classifier, data, members=2, num_steps=5, progress=False)
    fit = ens.members[0]
    out = {}
    for name, post in (("kron", kron), ("sub", sub), ("ensemble", ens), ("fit", fit)):
        out[name] = post.save(folder / f"{name}.pt").read_bytes()
    return out


def changed(tmp_path, saved, name, change):
    path = tmp_path / f"{name}.pt"
    path.write_bytes(saved[name])
    payload = torch.load(path, weights_only=True)
    change(payload)
    files.atomic_save(payload, path)
    return path


def first_factor(payload):
    return payload["state"]["H"][0][0]


CASES = [
    ("kron", lambda p: p["map_weights"].pop("fc1.weight"), "not the model's sites"),
    ("kron", lambda p: p["map_weights"]["fc1.weight"].fill_(math.nan), "NaN or infinite"),
    ("kron", lambda p: p["options"].update(hessian="kfac"), "options entry"),
    ("kron", lambda p: p["options"].update(colour=1), "options entry"),
    ("kron", lambda p: p.__setitem__("options", "kron"), "options entry"),
    ("kron", lambda p: p["state"]["prior_precision"].fill_(-1.0), "must be positive"),
    ("kron", lambda p: p["state"]["prior_precision"].fill_(math.nan), "not finite"),
    ("kron", lambda p: first_factor(p).fill_(math.nan), "not finite"),
    ("kron", lambda p: p["state"]["H"][0].__setitem__(0, torch.eye(3)), "Kronecker factors"),
    ("kron", lambda p: p["state"].__setitem__("H", "kron"), "Kronecker factors"),
    ("kron", lambda p: p["state"].__setitem__("likelihood", "regression"), "likelihood"),
    ("kron", lambda p: p["state"].__setitem__("mean", torch.zeros(5)), "mean"),
    ("kron", lambda p: p["state"].__setitem__("n_data", -3), "n_data"),
    ("kron", lambda p: p["state"].__setitem__("_last_layer_name", "fc9"), "names no layer"),
    ("kron", lambda p: p.__setitem__("info", "x"), "not a mapping"),
    ("sub", lambda p: p["info"]["subnetwork_indices"].__setitem__(0, 10**6), "unique positions"),
    (
        "sub",
        lambda p: p["info"]["subnetwork_indices"].__setitem__(
            1, p["info"]["subnetwork_indices"][0]
        ),
        "unique positions",
    ),  # fmt: skip
    ("sub", lambda p: p["state"].__setitem__("H", torch.ones(10, 9)), "10 x 10"),
    ("sub", lambda p: p["state"]["H"].__setitem__((0, 1), 5.0), "not symmetric"),
    (
        "ensemble",
        lambda p: p["members"][1]["model"]["spec"]["args"].update(
            likelihood={"class": "Gaussian", "args": {"noise": 1.0}}
        ),
        "not member 0's",
    ),  # fmt: skip
    ("ensemble", lambda p: p.__setitem__("options", [1]), "not a mapping"),
    ("fit", lambda p: p.__setitem__("history", "long"), "history entry is not a mapping"),
    ("fit", lambda p: p["history"].__setitem__("losses", "x"), "losses"),
    ("fit", lambda p: p["history"].__setitem__("wall_time", -1.0), "wall_time"),
]


@pytest.mark.parametrize("name, change, phrase", CASES)
def test_a_changed_file_is_refused_naming_the_entry(tmp_path, saved, name, change, phrase):
    path = changed(tmp_path, saved, name, change)
    with pytest.raises(ValueError, match=phrase) as err:
        zoo.load(path)
    assert str(path) in str(err.value)


def test_every_saved_kind_loads_unchanged(tmp_path, saved):
    for name in saved:
        path = tmp_path / f"{name}.pt"
        path.write_bytes(saved[name])
        assert isinstance(zoo.load(path), zoo.Posterior)


def test_laplace_torchs_exit_is_an_error_not_the_end_of_the_process(monkeypatch):
    """laplace-torch calls exit() (status 0, no message) when it cannot decompose a Kronecker
    factor: every call into it turns that into the library's error naming the call; its linear
    algebra failures too."""
    fit = zoo.laplace(classifier(), classification(), num_steps=20, progress=False)
    x = classification(6)[0]

    def exits(*args, **kwargs):
        exit()

    monkeypatch.setattr(fit.laplace, "functional_samples", exits)
    with pytest.raises(LaplaceTorchError, match="LaplaceFit.predict: laplace-torch could not"):
        fit.predict(x, num_samples=4, progress=False)
    monkeypatch.setattr(fit.laplace, "sample", exits)
    with pytest.raises(LaplaceTorchError, match="LaplaceFit.sample"):
        fit.sample(4)
    fit.laplace.H.eigenvalues[0][0].fill_(math.nan)  # a curvature no decomposition survives
    fit.laplace.H.eigenvectors[0][0].fill_(math.nan)
    monkeypatch.undo()
    with pytest.raises(LaplaceTorchError, match="not positive definite"):
        fit.predict(x, num_samples=4, progress=False)
