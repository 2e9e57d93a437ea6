"""benchmarks/suite.py, the suite's one helper: atomic results, the printed tables kept as JSON,
the generated page (and that the committed page is what the committed results render to), and
the rules every script keeps (no library global written, no script outside the suite)."""

import ast
import json
import os
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import depth
    import posch_pilz
    import reference
    import suite
finally:
    sys.path.remove(str(REPO / "benchmarks"))


def test_writes_json_that_reads_back_and_replaces_the_previous_file(tmp_path):
    path = tmp_path / "sub" / "out.json"
    suite.write_json({"a": [1, 2.5]}, path)
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}
    suite.write_json({"b": None}, path, indent=None)
    assert json.loads(path.read_text()) == {"b": None}
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]  # no temporary left
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_an_object_json_cannot_hold_leaves_the_file_untouched(tmp_path):
    path = tmp_path / "out.json"
    suite.write_json({"kept": 1}, path)
    with pytest.raises(TypeError, match="not JSON serializable"):
        suite.write_json({"bad": object()}, path)
    assert json.loads(path.read_text()) == {"kept": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_rename_removes_its_temporary_and_keeps_the_file(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    suite.write_json({"kept": 1}, path)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        suite.write_json({"new": 2}, path)
    assert json.loads(path.read_text()) == {"kept": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


PRINTED = """width 256: diagonal 1.0 ms
| row | ms | x diag |
| --- | ---: | ---: |
| diagonal | 1.0 | 1.00 |
| lowrank r=10 | 2.5 | 2.50 |

load after 0.5
"""


def test_the_printed_tables_are_kept_cell_by_cell():
    assert suite.blocks(PRINTED) == [
        {"text": "width 256: diagonal 1.0 ms"},
        {
            "columns": ["row", "ms", "x diag"],
            "align": ["---", "---:", "---:"],
            "rows": [["diagonal", "1.0", "1.00"], ["lowrank r=10", "2.5", "2.50"]],
        },
        {"text": "load after 0.5"},
    ]
    assert suite.blocks("| not a table\n\nafter") == [{"text": "| not a table"}, {"text": "after"}]
    table = suite.blocks(PRINTED)[1]
    assert (
        suite.markdown(table["columns"], table["rows"], table["align"]) == PRINTED.split("\n")[1:5]
    )


def test_a_run_writes_what_it_printed_only_when_it_ends(tmp_path, capsys):
    out = tmp_path / "width.json"
    with suite.record("width", out, ["--rounds", "1"]) as run:
        print(PRINTED)
        run.data = {"widths": [256]}
    assert PRINTED in capsys.readouterr().out  # still on the terminal
    result = json.loads(out.read_text())
    assert result["name"] == "width" and result["question"] == suite.SCRIPTS["width"]
    assert result["command"] == "python benchmarks/width.py --rounds 1"
    assert result["blocks"] == suite.blocks(PRINTED) and result["data"] == {"widths": [256]}
    assert {
        "cpu",
        "cores",
        "gpu",
        "python",
        "torch",
        "pyro",
        "threads",
        "load",
        "load_after",
    } <= set(result["machine"])
    with pytest.raises(RuntimeError), suite.record("width", out, []):
        print("| a | b |\n| --- | --- |\n| 1 | 2 |")
        raise RuntimeError("a run that fails")
    assert json.loads(out.read_text()) == result  # the previous result is kept
    with pytest.raises(ValueError, match="not a script of the suite"):
        with suite.record("fairness", out, []):
            pass


def test_the_page_names_each_question_its_results_and_a_missing_one(tmp_path):
    results = tmp_path / "results"
    suite.save("width", PRINTED, None, results / "width.json", ["--rounds", "1"])
    suite.save("width", "| a |\n| --- |\n| 1 |", None, results / "width-cuda.json", ["--device",
               "cuda"], earlier=["python benchmarks/width.py --widths 64"])  # fmt: skip
    findings = tmp_path / "findings.md"
    findings.write_text("## What earlier studies decided\n\n- one finding (`abc1234`).\n")
    page = suite.render(results, findings)
    for question in suite.SCRIPTS.values():
        assert f"\n## {question}\n" in page
    assert "No result yet: run `python benchmarks/step_time.py`." in page
    width = page.index(suite.SCRIPTS["width"])
    assert page.index("`python benchmarks/width.py --rounds 1`", width) < page.index(
        "python benchmarks/width.py --device cuda", width
    )  # the plain result first, then the one from elsewhere with the runs it merges
    assert (
        "python benchmarks/width.py --widths 64\npython benchmarks/width.py --device cuda" in page
    )
    assert "| lowrank r=10 | 2.5 | 2.50 |" in page and page.endswith("- one finding (`abc1234`).\n")


def test_the_committed_page_is_what_the_committed_results_render_to():
    assert suite.main(["--check"]) == 0, "run python benchmarks/suite.py"
    page = suite.PAGE.read_text()
    for path in sorted(suite.RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        assert result["name"] in suite.SCRIPTS, path.name
        assert "\n".join(suite.section(result)) in page, path.name


def test_the_suite_is_every_script_in_the_folder():
    scripts = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - {"suite"}
    assert scripts == set(suite.SCRIPTS)
    assert len(scripts) <= 16


def _library_names(tree: ast.AST) -> set[str]:
    """Names a script binds to the library: ``import zoo``, ``import guides.x as g``,
    ``from zoo.training import rate``, ``from guides import AutoDiagonal``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("zoo", "guides"):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ("zoo", "guides"):
                names.update(a.asname or a.name for a in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def library_writes(source: str) -> list[str]:
    """``line: target`` of each write of a library global in ``source``: an assignment to an
    attribute of something imported from ``zoo`` or ``guides`` (``rate_rule.VALLEY_FACTOR =``)
    or a ``setattr`` on it."""
    tree = ast.parse(source)
    library = _library_names(tree)
    writes = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            targets = [ast.Attribute(value=node.args[0], attr="?")] if node.args else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and _root(t) in library:
                    writes.append(f"{node.lineno}: {ast.unparse(t)}")
    return writes


def test_no_benchmark_writes_a_library_global():
    """A benchmark reaches the library's knobs only through public options: none assigns a
    module's or a class's attribute of ``zoo`` or ``guides``."""
    found = {
        path.name: writes
        for path in sorted((REPO / "benchmarks").glob("*.py"))
        if (writes := library_writes(path.read_text()))
    }
    assert found == {}


def test_the_library_write_check_sees_one():
    source = (
        "from zoo.training import rate_rule\nimport zoo\n"
        "rate_rule.VALLEY_FACTOR = 1.0\nzoo.training.rate.sweep_length = len\n"
        "setattr(rate_rule, 'X', 2)\nfit = object()\nfit.options = {}\n"
    )
    assert [w.split(":")[0] for w in library_writes(source)] == ["3", "4", "5"]


def test_the_stated_priors_are_those_of_the_models_that_ran():
    """The depth study and the diabetes references state the prior ``N(0, 2 / fan_in)``: the
    models their scripts build carry it (He's gain, sqrt(2), per layer), not ``N(0, 1)``."""
    import torch
    from pyro import poutine

    models = [depth.network(d) for d in depth.DEPTHS] + [reference.load("diabetes")[2]()]
    for model in models:
        trace = poutine.trace(model).get_trace(torch.zeros(3, 10))
        for name, site in trace.nodes.items():
            if name not in model.site_shapes or name == "noise":
                continue
            fan_in = site["value"].shape[-1] if name.endswith("weight") else None
            if fan_in is not None:  # a bias takes its layer's fan-in
                want = (2.0 / fan_in) ** 0.5
            sd = site["fn"].stddev  # the prior's standard deviation of every weight
            assert torch.allclose(sd, torch.full_like(sd, want)), name
    stated = "N(0, 2 / fan_in)"
    notebook = (REPO / "notebooks" / "09_structure_and_depth.ipynb").read_text()
    for text in (depth.__doc__, reference.__doc__, notebook):
        assert stated in text
    assert "default `N(0, 1)`" not in notebook and "default ``N(0, 1)``" not in depth.__doc__


def test_notebook_03_shows_and_quotes_the_committed_paper_runs():
    """Notebook 03's saved tables come from the committed runs of ``posch_pilz.py``, and every
    two-decimal test error its prose or the README's notebook table quote is a committed run's
    or the paper's; the page shows each run as its JSON says."""
    import re

    nb = json.loads((REPO / "notebooks" / "03_tridiagonal_posch_pilz.ipynb").read_text())
    outputs = "\n".join(
        "".join(out.get("data", {}).get("text/plain", ""))
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for out in cell.get("outputs", [])
    )
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    readme_row = next(
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("| [03_tridiagonal_posch_pilz]")
    )
    runs = [
        json.loads(p.read_text()) for p in sorted((suite.RESULTS / "posch_pilz").glob("*.json"))
    ]
    assert runs, "no committed Posch & Pilz run"
    paper = posch_pilz.PAPER  # Table I: Bayesian and frequentist errors by width
    quoted = {f"{100 * v:.2f}%" for table in paper.values() for v in table["test_error"].values()}
    page = suite.PAGE.read_text()
    for r in runs:
        error = f"{100 * r['test_error']:.2f}%"
        quoted.add(error)
        row = next(
            line
            for line in outputs.splitlines()
            if line.startswith(f"zoo, {r['family']}, {r['hidden']} units ")
        )
        assert row.split()[4:7] == [error, f"{r['nll']:.4f}", f"{r['ece']:.4f}"], row
        assert f"{error} ({r['family']}, {r['hidden']} units" in readme_row, readme_row
        c = r["certainty"]
        assert (
            f"| zoo, {r['family']}, {r['hidden']} units | {error} | {r['nll']:.4f} | "
            f"{r['ece']:.4f} | {c['certain_correct']} / {c['uncertain_correct']} | "
            f"{c['certain_wrong']} / {c['uncertain_wrong']} |"
        ) in page
        assert r["iterations"] == 100_000 and r["test_size"] == 10_000 and r["samples"] == 200
    for text in (prose, readme_row):
        assert set(re.findall(r"\d\.\d\d%", text)) <= quoted, text
