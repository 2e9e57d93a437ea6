"""README.md: at most about 250 lines, and every Python block in it runs as written, in order,
in one fresh process (in a scratch folder: the blocks write files)."""

import ast
import re

import pytest

from tests.conftest import REPO, run_script

pytestmark = pytest.mark.slow  # runs the README's code

README = (REPO / "README.md").read_text()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_every_python_block_of_the_readme_runs_as_written(tmp_path):
    blocks = python_blocks(README)
    assert len(blocks) >= 6, "the README's examples are its python blocks"
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(blocks))
    run = run_script(script)
    assert run.returncode == 0, run.stderr[-4000:]
    assert (tmp_path / "toy.pt").exists() and (tmp_path / "run.ckpt").exists()
    out = run.stdout
    first = ast.literal_eval(next(x for x in out.splitlines() if x.startswith("{'rmse'")))
    assert 0.9 <= first["coverage_95"] <= 0.99, first  # "near 0.95 when calibrated"
    diagnostics = ast.literal_eval(next(x for x in out.splitlines() if "lp_r_hat" in x))
    assert diagnostics["divergences"] == 0, diagnostics
    assert max(diagnostics["lp_r_hat"], diagnostics["outputs_r_hat"]) <= 1.01, diagnostics
    assert "ReferenceNotConverged" not in run.stderr
    table = out[out.index("reference_coverage") :]  # the compare table, printed whole
    assert "..." not in table.split("\n\n")[0]
