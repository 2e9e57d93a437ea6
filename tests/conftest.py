import os
from pathlib import Path

import pyro
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

#: Seconds after which a child process, notebook or wait of a test is taken to hang, not to be
#: slow: no test limits how fast a loaded machine runs (set ZOO_TEST_HANG_AFTER to change it).
HANG_AFTER = float(os.environ.get("ZOO_TEST_HANG_AFTER", 3600))

#: Test files that run child processes, notebooks, HMC chains or MNIST fits: their tests are
#: marked ``slow``, and ``python -m pytest -m "not slow"`` is the quick first check (the
#: README's Quickstart runs everything).
SLOW_FILES = {
    "test_benchmarks.py",
    "test_docs.py",
    "test_install.py",
    "test_readme.py",
    "test_benchmark_dropout.py",
    "test_notebooks.py",
    "test_notebook_outputs.py",
    "test_saved_runs.py",
    "test_cli.py",
    "test_compare.py",
    "test_distributed.py",
    "test_lightning.py",
    "test_mnist.py",
    "test_reference.py",
    "test_conjugate_families.py",
    "test_cuda.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


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

    from zoo.training.options import Engine

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
    config.addinivalue_line(
        "markers", "slow: runs child processes, notebooks, HMC or MNIST (tests/conftest.py)"
    )
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
