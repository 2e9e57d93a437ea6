import os
import subprocess
from pathlib import Path

import pyro
import pytest
import torch

from tests.warm import WARM

REPO = Path(__file__).resolve().parents[1]

#: Seconds after which a child process, notebook or wait of a test is taken to hang, not to be
#: slow: no test limits how fast a loaded machine runs (set ZOO_TEST_HANG_AFTER to change it).
HANG_AFTER = float(os.environ.get("ZOO_TEST_HANG_AFTER", 3600))


def run_script(script: Path) -> subprocess.CompletedProcess:
    """``python script`` in its own folder (the scratch folder it was written to: examples write
    files) with the checkout importable and matplotlib off screen; output captured, the wait
    bounded by :data:`HANG_AFTER`; run by the worker's warm interpreter (:mod:`tests.warm`)."""
    return WARM.run([str(script)], cwd=script.parent, timeout=HANG_AFTER,
                    env={**os.environ, "MPLBACKEND": "Agg"})  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_rng():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield


@pytest.fixture(autouse=True)
def _cpu_by_default(request, monkeypatch):
    """The suite checks CPU semantics (references are CPU tensors) on GPU machines too:
    ``device="auto"`` means the CPU here, through the library's documented environment
    variable ``ZOO_DEVICE`` (:mod:`zoo.runtime.devices`), except in
    tests/zoo/test_cuda.py. Child processes the tests start inherit it."""
    from zoo.runtime.devices import DEVICE_VARIABLE

    if request.module.__name__.endswith("test_cuda"):
        monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
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
    from zoo.runtime.packages import torchvision_problem

    problem = torchvision_problem()  # one clear stop, not an error per module that imports it
    if problem is not None:
        pytest.exit(f"the test suite needs a working torchvision: {problem}", returncode=4)
    config.addinivalue_line(
        "markers",
        "slow: runs child processes, notebooks, HMC or MNIST, or checks convergence, Monte Carlo "
        'error or memory growth over seconds (the quick tier, -m "not slow", leaves them out)',
    )
    # Under pytest-xdist the workers share the cores: each takes its share, and so do the
    # processes it starts (OpenMP threads that outnumber the cores spin and slow every test).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    threads = max(1, min(4, (os.cpu_count() or 1) // workers))
    torch.set_num_threads(threads)
    if workers > 1:
        os.environ["OMP_NUM_THREADS"] = str(threads)
