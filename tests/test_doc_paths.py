"""Every ``zoo.``/``guides.`` dotted path and every source path the documentation, the README and
the CHANGELOG name exists, and the version is one: the package's, the installed metadata's and
the CHANGELOG's latest section."""

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest

import zoo

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md"]
    + list((REPO / "docs").glob("*.md"))
    + list((REPO / "docs" / "guide").glob("*.md"))
)
#: A dotted name inside backquotes, up to the first character that is not part of a name.
DOTTED = re.compile(r"`((?:zoo|guides)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
#: A source path inside backquotes.
SOURCE = re.compile(r"`((?:zoo|guides|tests|benchmarks|notebooks|docs)/[A-Za-z0-9_./-]+)`")
#: What follows an old name in a migration note (``old`` -> ``new``): only the new must exist.
RENAMED = re.compile(r"`?\s*(->|→|was renamed|became|moved to|: import)")
#: Paths a run or a build makes (a built site, a benchmark's results), not sources.
MADE = ("docs/_build/", "benchmarks/results/")
#: What follows a path that names a file as it was at a commit (``benchmarks/x.py`` at ``abc1234``).
AT_COMMIT = re.compile(r"`*\s+at\s+`{1,2}[0-9a-f]{7,40}`")


def in_history(path: str) -> bool:
    """``path`` was a file of some commit of the checkout (the CHANGELOG names removed files)."""
    import subprocess

    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "--", path], cwd=REPO,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def missing_files(text: str, history: bool = False) -> list[str]:
    """The source paths ``text`` names that do not exist: not a made path, not one named at a
    commit, and with ``history`` not a file of an earlier commit."""
    missing = set()
    for match in SOURCE.finditer(text):
        path = match.group(1).rstrip(".")
        if "*" in path or path.startswith(MADE) or (REPO / path).exists():
            continue
        if AT_COMMIT.match(text, match.end()) or (history and in_history(path)):
            continue
        missing.add(path)
    return sorted(missing)


def resolves(dotted: str) -> bool:
    """``dotted`` is a module, or an attribute chain from the longest importable module."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def named_paths(text: str):
    """``(dotted name, is an old name in a migration note)`` of ``text``."""
    for match in DOTTED.finditer(text):
        name = match.group(1)
        old = RENAMED.match(text, match.end()) is not None
        yield name, old


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_path_exists(document):
    text = document.read_text()
    missing = sorted({name for name, old in named_paths(text) if not old and not resolves(name)})
    assert not missing, f"{document.relative_to(REPO)} names {missing}"
    files = missing_files(text, history=document.name == "CHANGELOG.md")
    assert not files, f"{document.relative_to(REPO)} names files that do not exist: {files}"


def test_the_check_reads_a_path_at_a_commit_as_that_commits():
    text = "`benchmarks/gone.py` at `abc1234` and ``benchmarks/gone2.py`` at ``abc1234``"
    assert missing_files(text) == []
    assert missing_files("`benchmarks/gone.py` measured it") == ["benchmarks/gone.py"]


def test_the_check_sees_a_path_that_does_not_exist():
    assert resolves("zoo.fit") and resolves("zoo.results.posterior.Posterior.predict")
    assert not resolves("zoo.serial") and not resolves("zoo.options.grouped")
    text = "`zoo.trainer` -> `zoo.training.fitting`; see `zoo.fingerprint`."
    assert list(named_paths(text)) == [
        ("zoo.trainer", True),
        ("zoo.training.fitting", False),
        ("zoo.fingerprint", False),
    ]


def test_one_version():
    assert importlib.metadata.version("bnn-zoo") == zoo.__version__
    changelog = (REPO / "CHANGELOG.md").read_text()
    latest = re.search(r"^## (\S+)", changelog, re.M).group(1)
    assert latest == zoo.__version__, (latest, zoo.__version__)
    # the release on top is dated when it is cut, or says it is not yet
    top = re.search(r"^## .*$", changelog, re.M).group(0)
    assert re.fullmatch(r"## \S+ \((unreleased|\d{4}-\d{2}-\d{2})\)", top), top
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()


#: A Sphinx cross-reference to a name of the library in a docstring, or a name in literal
#: quotes (````zoo.fit(...)````).
ROLE = re.compile(
    r":(?:mod|func|class|meth|data|attr|exc):`~?((?:zoo|guides)(?:\.\w+)+)`"
    r"|``((?:zoo|guides)(?:\.[A-Za-z_]\w*)+)"
)


def test_every_docstring_reference_resolves():
    """The ``:mod:``/``:func:``/``:class:``/... references and the dotted names in literal
    quotes of every docstring and comment of ``zoo`` and ``guides`` name something that
    exists."""
    missing = []
    for package in ("zoo", "guides"):
        for path in sorted((REPO / package).rglob("*.py")):
            for pair in set(ROLE.findall(path.read_text())):
                name = pair[0] or pair[1]
                if not resolves(name):
                    missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing, "\n".join(missing)


def test_the_family_table_of_recipes_is_the_registrys():
    """docs/families.md's recipe table has a row per family (and the joint one) whose learning
    rate is the family's declared ``lr_scale`` (and ``full_batch_lr_scale`` where it has one)."""
    import guides

    text = (REPO / "docs" / "families.md").read_text()
    table = text.split("## Recipes")[1].split("\n## ")[0]
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2].strip()
        for line in table.splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == {*guides.available(), "joint"}
    for name, cell in rows.items():
        recipe = guides.recipe(name)
        want = f"x{recipe.lr_scale:g}"
        if recipe.full_batch_lr_scale is not None:
            want += f" (full batch x{recipe.full_batch_lr_scale:g})"
        assert cell == want, name
