"""The release a user installs: ``python -m build`` makes an sdist and a wheel that ``twine
check`` passes; the wheel holds ``zoo``, ``guides`` and their ``py.typed`` markers and nothing
of the repository's tests, benchmarks or notebooks; installed (not editable) into a fresh
virtual environment and run from outside the clone, it runs the demo and ``python -m zoo info``.

The fresh environment reaches this environment's torch, Pyro and the rest through a path file
(no package index is needed) but not its editable install of the project, whose finder only a
site directory's own ``.pth`` files would load."""

import subprocess
import sys
import sysconfig
import zipfile

import pytest

import zoo
from tests.conftest import HANG_AFTER, REPO

pytestmark = pytest.mark.slow  # builds the project and installs it in a new environment


def run(*command, cwd, env=None):
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=HANG_AFTER,
                          env=env)  # fmt: skip
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel of this checkout, built without network (the build backend
    installed here, ``--no-isolation``)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO), cwd=out)
    return out


def test_the_sdist_and_the_wheel_are_built_and_pass_twine(dist):
    version = zoo.__version__
    wheel = dist / f"bnn_zoo-{version}-py3-none-any.whl"
    sdist = dist / f"bnn_zoo-{version}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in dist.iterdir())
    out = run(sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist), cwd=dist)
    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_packages_and_their_type_markers_only(dist):
    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"zoo", "guides", f"bnn_zoo-{zoo.__version__}.dist-info"}, tops
    assert "zoo/py.typed" in names and "guides/py.typed" in names
    for package in ("zoo", "guides"):
        sources = {p.relative_to(REPO).as_posix() for p in (REPO / package).rglob("*.py")}
        assert sources <= set(names), sorted(sources - set(names))[:5]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    metadata = zipfile.ZipFile(next(dist.glob("*.whl"))).read(
        f"bnn_zoo-{zoo.__version__}.dist-info/METADATA").decode()  # fmt: skip
    assert f"Version: {zoo.__version__}" in metadata
    assert "Requires-Dist: torch<2.15,>=2.11" in metadata


def fresh_environment(folder):
    """A new virtual environment in ``folder`` that reaches this environment's dependencies
    through a path file (no package index), not its editable install of the project:
    ``(python, site directory)``."""
    # no pip or setuptools of its own: this environment's (setuptools >= 77 builds the project)
    run(sys.executable, "-m", "venv", "--without-pip", str(folder), cwd=folder.parent)
    python = folder / "bin" / "python"
    site = run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
               cwd=folder.parent).strip()  # fmt: skip
    (folder / site / "zoo_test_dependencies.pth").write_text(sysconfig.get_path("purelib"))
    return python, site


@pytest.fixture(scope="module")
def wheel_env(dist, tmp_path_factory):
    """The wheel installed (not editable) in a fresh environment: ``(python, site)``."""
    python, site = fresh_environment(tmp_path_factory.mktemp("wheel") / "env")
    run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
        str(next(dist.glob("*.whl"))), cwd=python.parent)  # fmt: skip
    return python, site


def test_the_installed_wheel_runs_the_demo_and_info_outside_the_clone(wheel_env, tmp_path):
    python, site = wheel_env
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg",
           "ZOO_DATA": str(tmp_path / "data")}  # fmt: skip
    where = run(str(python), "-c", "import zoo, guides; print(zoo.__file__, guides.__file__)",
                cwd=work, env=env)  # fmt: skip
    assert all(path.startswith(site) for path in where.split()), (where, site)
    demo = run(str(python), "-m", "zoo", "demo", "--steps", "50", "--quiet", cwd=work, env=env)
    assert "test rmse" in demo and (work / "zoo-demo.png").exists()
    info = run(str(python), "-m", "zoo", "info", cwd=work, env=env)
    assert "bnn-zoo:" in info and zoo.__version__ in info and "a working pair" in info


def test_the_sdist_builds_the_wheel_and_ships_no_test_suite(dist):
    """The sdist holds the packages, the licence and the metadata; the test suite needs the
    repository's data and fixtures, so it ships none of it (nor benchmarks, notebooks, docs).
    The licence is an SPDX expression (PEP 639)."""
    import tarfile

    sdist = next(dist.glob("*.tar.gz"))
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    tops = {n.split("/")[0] for n in names if n}
    assert not tops & {"tests", "benchmarks", "notebooks", "docs"}, sorted(tops)
    assert {"zoo", "guides", "LICENSE", "pyproject.toml", "README.md"} <= tops, sorted(tops)
    metadata = zipfile.ZipFile(next(dist.glob("*.whl"))).read(
        f"bnn_zoo-{zoo.__version__}.dist-info/METADATA").decode()  # fmt: skip
    assert "License-Expression: MIT" in metadata
    assert "License-File: LICENSE" in metadata


#: A user's script, checked (never run) by mypy from outside the clone: the README's blocks,
#: and the types its blocks rely on, held exactly (``assert_type``).
TYPED_USE = """
import torch
from typing_extensions import assert_type

import zoo

x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
classifier = zoo.models.BayesianMLP(2, (4,), 2, task="classification")
assert_type(classifier, zoo.models.BayesianMLP[zoo.ClassificationPrediction])
fit = zoo.fit(classifier, "diagonal", (x, y), num_steps=2)
assert_type(fit.predict(x), zoo.ClassificationPrediction)
assert_type(fit.predict(x).mutual_information, torch.Tensor)
regressor = zoo.models.BayesianMLP(2, (4,))
assert_type(zoo.fit(regressor, "lowrank", (x, y.float())).predict(x), zoo.RegressionPrediction)
converted = zoo.models.from_module(torch.nn.Linear(2, 2))
assert_type(zoo.prior_predictive(converted, x), zoo.ClassificationPrediction)
assert_type(zoo.fit(zoo.models.LeNet5(), "map", (x, y)).predict(x), zoo.ClassificationPrediction)
table = zoo.compare(lambda: regressor, ["diagonal"], (x, y), (x, y))
table, fits = zoo.compare(lambda: regressor, ["diagonal"], (x, y), (x, y), return_fits=True)
assert_type(fits, dict[str, zoo.Posterior])
"""


def readme_blocks() -> str:
    """The README's Python blocks, one script."""
    import re

    text = (REPO / "README.md").read_text()
    return "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))


def type_check(python, folder) -> str:
    """mypy (this environment's) over :data:`TYPED_USE` and the README's blocks in ``folder``,
    outside the clone, against the project as the environment of ``python`` installs it.
    torchvision ships no type hints (``import-untyped``): not ours to check."""
    (folder / "typed_use.py").write_text(TYPED_USE)
    (folder / "readme_blocks.py").write_text(readme_blocks())
    mypy = [sys.executable, "-m", "mypy", "--python-executable", str(python), "--no-incremental",
            "--cache-dir", str(folder / ".mypy_cache"), "--disable-error-code", "import-untyped",
            "typed_use.py", "readme_blocks.py"]  # fmt: skip
    done = subprocess.run(mypy, cwd=folder, capture_output=True, text=True, timeout=HANG_AFTER)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_a_users_type_checker_sees_the_api_of_the_installed_wheel(wheel_env, tmp_path):
    python, _ = wheel_env
    assert "Success" in type_check(python, tmp_path)


def test_a_users_type_checker_sees_the_api_of_a_strict_editable_install(tmp_path):
    """``pip install -e . --config-settings editable_mode=strict`` (the README's line for type
    checkers) puts a tree of links on a static path, which mypy reads; the default editable
    install's import hook is invisible to it."""
    python, site = fresh_environment(tmp_path / "env")
    run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
        "--quiet", "-e", str(REPO), "--config-settings", "editable_mode=strict",
        cwd=tmp_path)  # fmt: skip
    where = run(str(python), "-c", "import zoo; print(zoo.__file__)", cwd=tmp_path).strip()
    assert "__editable__" in where, where  # the tree of links, not the import hook
    work = tmp_path / "work"
    work.mkdir()
    assert "Success" in type_check(python, work)
