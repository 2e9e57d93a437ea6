"""The documentation pages' examples run as written: each page's Python blocks in order, in one
fresh process per page (in a scratch folder: the blocks write files). A block the tests cannot
run says why, in a ``<!-- docs-test: skip (why) -->`` line right above it."""

import re

import pytest

from tests.conftest import REPO, run_script

BLOCK = re.compile(r"(<!-- docs-test: skip \((.+?)\) -->\n)?```python\n(.*?)```", flags=re.S)
PAGES = sorted(
    p.relative_to(REPO)
    for p in (REPO / "docs").rglob("*.md")
    if "generated" not in p.parts and "```python" in p.read_text()
)


def blocks(page) -> list[tuple[str, str | None]]:
    """``(code, why it is skipped or None)`` of every Python block of ``page``, in order."""
    return [(m[3], m[2]) for m in BLOCK.finditer((REPO / page).read_text())]


#: The pages with a block to run.
RUN = [p for p in PAGES if any(why is None for _, why in blocks(p))]


def test_the_pages_have_examples_and_every_skip_says_why():
    assert {str(p) for p in PAGES} >= {"docs/index.md", "docs/guide/fitting.md"}, PAGES
    for page in PAGES:
        for code, why in blocks(page):
            compile(code, str(page), "exec")  # every block is Python, skipped or not
            assert why is None or len(why) > 20, (page, why)
    skipped = {str(p) for p in PAGES for _, why in blocks(p) if why}
    # a skip is an exception: name its page here when one is added
    assert skipped <= {"docs/index.md", "docs/guide/scaling.md"}, skipped


def test_the_examples_fit_the_pages_code_column():
    """The site's code column shows about 72 characters beside the navigation and the page's
    contents; a longer line scrolls sideways (seen in a headless browser)."""
    wide = [
        f"{page}: {line}"
        for page in PAGES
        for code, _ in blocks(page)
        for line in code.splitlines()
        if len(line) > 72
    ]
    assert not wide, "\n".join(wide)


def test_a_skip_marker_reads_as_one():
    text = "<!-- docs-test: skip (it needs four GPUs to run) -->\n```python\nx = 1\n```\n"
    assert [m[2] for m in BLOCK.finditer(text)] == ["it needs four GPUs to run"]


@pytest.mark.slow  # fits small models on MNIST slices and toy data, a page at a time
@pytest.mark.parametrize("page", RUN, ids=[str(p) for p in RUN])
def test_every_python_block_of_the_page_runs_as_written(page, tmp_path):
    code = [c for c, why in blocks(page) if why is None]
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(code))
    run = run_script(script)
    assert run.returncode == 0, f"{page}:\n{run.stderr[-4000:]}"
