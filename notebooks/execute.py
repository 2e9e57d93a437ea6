"""Execute notebooks in their full configuration and save their outputs in place.

    python notebooks/execute.py                     # every notebook
    python notebooks/execute.py notebooks/05_*.ipynb

The kernel runs with matplotlib's inline backend (no MPLBACKEND), so every figure is saved
as an image; ``ZOO_DATA`` names the MNIST root (default: the shared copy beside the checkout).
The tests run the same notebooks with ``ZOO_SMOKE=1`` and check the saved figures
(tests/test_notebook_outputs.py).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(paths: list[str]) -> None:
    if os.environ.get("ZOO_SMOKE"):
        raise SystemExit(
            "ZOO_SMOKE is set: this script writes the full run's outputs into the notebooks, "
            "and a smoke run's would replace them; unset it (the tests run the smoke "
            "configuration without saving, tests/test_notebook_outputs.py)"
        )
    os.environ.pop("MPLBACKEND", None)
    os.environ.setdefault("ZOO_DATA", str(HERE.parents[1] / "shared" / "datasets"))
    for path in [Path(p) for p in paths] or sorted(HERE.glob("*.ipynb")):
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(
            nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
        ).execute()
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
