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


def test_the_installed_wheel_runs_the_demo_and_info_outside_the_clone(dist, tmp_path):
    env_dir = tmp_path / "env"
    run(sys.executable, "-m", "venv", str(env_dir), cwd=tmp_path)
    python = env_dir / "bin" / "python"
    site = run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
               cwd=tmp_path).strip()  # fmt: skip
    (tmp_path / site / "zoo_test_dependencies.pth").write_text(sysconfig.get_path("purelib"))
    wheel = next(dist.glob("*.whl"))
    run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel),
        cwd=tmp_path)  # fmt: skip
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
