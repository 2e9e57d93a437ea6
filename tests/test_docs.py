"""The documentation site (docs/): it builds with warnings as errors, its API reference lists
every public name of zoo and guides, and every notebook is a page with its saved figures."""

import inspect
import re
import subprocess
import sys

import pytest

import guides
import zoo
from tests.conftest import HANG_AFTER, REPO

pytestmark = pytest.mark.slow  # builds the documentation site

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")
pytest.importorskip("pydata_sphinx_theme")


def public_names() -> set[str]:
    """``zoo.X`` and ``guides.X`` for every public class and function of ``zoo.__all__`` and
    ``guides.__all__``."""
    names = set()
    for module in (zoo, guides):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                names.add(f"{module.__name__}.{name}")
    return names


def test_the_api_reference_lists_every_public_name():
    listed, current = set(), None
    for line in (REPO / "docs" / "api.rst").read_text().splitlines():
        found = re.match(r"\.\. currentmodule:: (\S+)", line)
        current = found[1] if found else current
        entry = re.match(r"   ([A-Za-z_]\w*)$", line)
        if entry:
            listed.add(f"{current}.{entry[1]}")
    assert public_names() <= listed, sorted(public_names() - listed)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(REPO / "docs"),
            str(out),
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    assert build.returncode == 0, build.stderr[-5000:]
    notebooks = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
    assert notebooks and all((out / "notebooks" / f"{n}.html").exists() for n in notebooks)
    page = (out / "notebooks" / "02_swap_guides_mnist.html").read_text()
    assert page.count("<img") >= 2  # the saved figures, shown as images
    fit_page = (out / "generated" / "zoo.fit.html").read_text()
    assert "num_steps" in fit_page and "Parameters" in fit_page
    import zoo

    changes = (out / "changelog.html").read_text()
    assert f"{zoo.__version__} (" in changes  # the CHANGELOG itself, its release on top
    index = (out / "index.html").read_text()
    for url in ("https://pytorch.org/docs/stable/", "https://docs.pyro.ai/en/stable/",
                "https://python.arviz.org/en/stable/"):  # fmt: skip
        assert url in index, url
    assert f"{zoo.__version__}" in index  # the version single-sourced from zoo.__version__
