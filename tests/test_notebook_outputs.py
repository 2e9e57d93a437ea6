"""The committed notebooks as a website shows them: every figure saved as an image, once."""

import ast
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # reads and re-runs the notebooks' figures

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: Calls in a cell that make a figure.
FIGURE_CALLS = ("plots.", "zaz.plot_", "plt.subplots", "plt.figure", ".plot(", "imshow(")


def code_cells(path):
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            yield index, "".join(cell["source"]), cell.get("outputs", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_is_saved_as_an_image_once(path):
    for index, source, outputs in code_cells(path):
        where = f"{path.name} cell {index}"
        texts = ["".join(o.get("data", {}).get("text/plain", "")) for o in outputs]
        bare = [
            t
            for t, o in zip(texts, outputs)
            if t.startswith("<Figure size") and "image/png" not in o.get("data", {})
        ]
        assert not bare, f"{where}: a figure saved as text only ({bare[0]!r})"
        images = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
        assert len(images) == len(set(images)), f"{where}: the same image is stored twice"
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
        if any(call in code for call in FIGURE_CALLS) and "savefig" not in code:
            assert images, f"{where} makes a figure but stores no image/png output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_progress_bar_is_saved(path):
    for index, _, outputs in code_cells(path):
        for out in outputs:
            text = "".join(out.get("text", ""))
            assert not any(unit in text for unit in ("pass/s]", "step/s]", "it/s]")), (
                f"{path.name} cell {index} saved a progress bar: pass progress=False"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_sampled_prediction_is_seeded(path):
    """A fit's ``predict`` draws from the guide with the global generator unless given a
    ``seed`` (``zoo.fit`` leaves that generator as it found it), so an unseeded call prints
    other numbers at each run and the prose cannot quote them. A reference's ``predict``
    reads stored draws: no seed."""
    for index, source, _ in code_cells(path):
        for call in re.findall(r"(\w+)\.predict\(([^()]*(?:\([^()]*\)[^()]*)*)\)", source):
            owner, arguments = call
            if owner.endswith("_ref") or owner == "reference":
                continue
            assert "seed=" in arguments, f"{path.name} cell {index}: {owner}.predict({arguments})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_loop_over_panels_draws_every_item_or_fails(path):
    """``for ax, item in zip(axes, items)`` stops at the shorter list: a figure of a fixed grid
    silently dropped the families past its size once. Each such loop zips with ``strict=True``
    (a mismatch raises in the notebooks' smoke runs), over ``plots.panels``' exact count."""
    for index, source, _ in code_cells(path):
        code = "\n".join(line for line in source.splitlines() if not line.startswith(("%", "!")))
        for node in ast.walk(ast.parse(code)):
            if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)):
                continue
            target = node.target.elts[0] if isinstance(node.target, ast.Tuple) else node.target
            if getattr(node.iter.func, "id", None) == "zip" and getattr(target, "id", "") == "ax":
                strict = [k for k in node.iter.keywords if k.arg == "strict"]
                assert strict and getattr(strict[0].value, "value", None) is True, (
                    f"{path.name} cell {index}, line {node.lineno}: zip(axes, ...) without "
                    "strict=True"
                )
