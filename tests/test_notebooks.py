"""Every notebook runs top to bottom in its small configuration (ZOO_SMOKE=1)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import HANG_AFTER

pytestmark = pytest.mark.slow  # executes the notebooks

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_eleven_notebooks():
    assert len(NOTEBOOKS) == 11


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, mnist_root, monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_SMOKE", "1")
    monkeypatch.setenv("ZOO_DATA", str(mnist_root))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=int(HANG_AFTER),
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors


def test_executing_with_zoo_smoke_set_refuses_to_overwrite_the_notebooks(tmp_path):
    """execute.py saves full runs into the notebooks; with ZOO_SMOKE set it would save a
    smoke run's outputs over them: it stops first, and the notebook is unchanged."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    notebook = sorted((REPO / "notebooks").glob("*.ipynb"))[0]
    before = notebook.read_bytes()
    proc = subprocess.run(
        [sys.executable, str(REPO / "notebooks" / "execute.py"), str(notebook)],
        env={**os.environ, "ZOO_SMOKE": "1"}, capture_output=True, text=True,
        timeout=HANG_AFTER,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "ZOO_SMOKE is set" in proc.stderr
    assert notebook.read_bytes() == before
