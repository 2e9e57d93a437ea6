"""benchmarks/saving.py: results written atomically, a kill mid-write keeps a whole file."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    from saving import write_json
finally:
    sys.path.remove(str(REPO / "benchmarks"))


def test_writes_json_that_reads_back_and_replaces_the_previous_file(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json({"a": [1, 2.5]}, path)
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}
    write_json({"b": None}, path, indent=None)
    assert json.loads(path.read_text()) == {"b": None}
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]  # no temporary left
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_an_object_json_cannot_hold_leaves_the_file_untouched(tmp_path):
    path = tmp_path / "out.json"
    write_json({"kept": 1}, path)
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json({"bad": object()}, path)
    assert json.loads(path.read_text()) == {"kept": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_rename_removes_its_temporary_and_keeps_the_file(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    write_json({"kept": 1}, path)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_json({"new": 2}, path)
    assert json.loads(path.read_text()) == {"kept": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


CHILD = """
import sys
sys.path.insert(0, {benchmarks!r})
from saving import write_json
big = {{"rows": [{{"i": i, "x": [0.5] * 50}} for i in range(20000)]}}
n = 0
while True:
    n += 1
    big["n"] = n
    write_json(big, {path!r})
    print(n, flush=True)
"""


def test_a_kill_mid_write_leaves_a_whole_file(tmp_path):
    """A writer killed at random moments while it rewrites a large file: the file always
    reads as one of the writes, never half of one."""
    path = tmp_path / "out.json"
    code = CHILD.format(benchmarks=str(REPO / "benchmarks"), path=str(path))
    for delay in (0.3, 0.55, 0.8):
        with subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
        ) as child:
            try:
                child.stdout.readline()  # one whole write done
                time.sleep(delay)
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
        saved = json.loads(path.read_text())
        assert len(saved["rows"]) == 20000 and saved["n"] >= 1
