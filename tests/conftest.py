import os
from pathlib import Path

import pyro
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_rng():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield


@pytest.fixture(autouse=True)
def _cpu_by_default(request, monkeypatch):
    """The suite checks CPU semantics (references are CPU tensors) on GPU machines too:
    zoo.fit's default device (``zoo.Engine(device="auto")``) is pinned to the CPU, except in
    tests/zoo/test_cuda.py."""
    if request.module.__name__.endswith("test_cuda"):
        yield
        return
    import dataclasses

    from zoo.options import Engine

    names = [f.name for f in dataclasses.fields(Engine)]
    defaults = list(Engine.__init__.__defaults__)  # those of the last len(defaults) fields
    defaults[names.index("device") - (len(names) - len(defaults))] = "cpu"
    monkeypatch.setattr(Engine.__init__, "__defaults__", tuple(defaults))
    yield


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The MNIST root, found as the library finds it (``zoo.data.data_root``: $ZOO_DATA, else
    ~/.cache/bnn-zoo/data); the tests download nothing and skip without the raw files."""
    from zoo.data import data_root

    root = data_root()
    if not (root / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        pytest.skip(f"MNIST raw files not found under {root} (set ZOO_DATA)")
    return root


def pytest_configure(config):
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
