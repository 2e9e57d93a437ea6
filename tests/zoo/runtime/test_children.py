"""Child processes end with their parent; scratch folders of killed runs go
(zoo.runtime.children)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import HANG_AFTER, REPO
from zoo.runtime import children

pytestmark = pytest.mark.skipif(os.name != "posix", reason="fork and signals")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: its parent (init) has not reaped it yet
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("kernel", [True, False], ids=["prctl", "watcher"])
def test_a_child_ends_when_its_parent_is_killed(tmp_path, kernel):
    """The parent forks a child that calls die_with_parent and sleeps; SIGKILL of the parent
    (no clean-up runs) must end the child, by the kernel's signal or by the watcher thread."""
    pid_file = tmp_path / "child.pid"
    module = REPO / "zoo" / "runtime" / "children.py"
    script = textwrap.dedent(f"""
        import importlib.util, os, sys, time
        spec = importlib.util.spec_from_file_location("children", {str(module)!r})
        children = importlib.util.module_from_spec(spec)  # the module alone, not all of zoo
        spec.loader.exec_module(children)
        if not {kernel}:
            children.sys.platform = "other"  # no prctl: the watcher alone
        parent = os.getpid()
        if os.fork() == 0:
            children.die_with_parent(parent)
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)
            os._exit(0)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + HANG_AFTER
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        while _alive(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()


def aged(path, seconds):
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_scratch_folders_are_removed_only_when_nobody_holds_them(tmp_path):
    """The lock says a folder is in use, not the process id: a live run in another PID
    namespace (its id not alive here) keeps its folder; a killed run's (its lock released by
    the kernel) is removed; a folder without a lock file (an earlier version's) by id and age;
    nothing just made."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    killed = tmp_path / f"zoo-hmc-{dead}-abcd"  # its lock file left, nobody holds it
    elsewhere = tmp_path / f"zoo-hmc-{dead}-efgh"  # a live run whose pid means nothing here
    legacy = tmp_path / f"zoo-hmc-{dead}-ijkl"  # no lock file, old
    young = tmp_path / f"zoo-hmc-{dead}-mnop"  # no lock file, just made
    other = tmp_path / "zoo-hmc-notapid-x"
    for folder in (killed, elsewhere, legacy, young, other):
        folder.mkdir()
    (killed / children.OWNER_LOCK).write_bytes(b"")
    (killed / "chain0.pt").write_bytes(b"x")
    for folder in (killed, elsewhere, legacy, other):
        aged(folder, 2 * children.UNLOCKED_STALE_AFTER)
    with children.holding(elsewhere / children.OWNER_LOCK):
        aged(elsewhere, 2 * children.UNLOCKED_STALE_AFTER)
        removed = children.remove_orphans("zoo-hmc-", str(tmp_path))
    assert sorted(removed) == sorted([killed, legacy])
    assert elsewhere.exists() and young.exists() and other.exists()


def test_a_scratch_folder_in_use_is_locked():
    with children.scratch_folder("zoo-test-") as folder:
        assert children.in_use(Path(folder) / children.OWNER_LOCK) is True
    assert not Path(folder).exists()


def _waits_forever():
    time.sleep(3600)


@pytest.mark.slow  # runs child processes: the full tier
def test_a_child_that_makes_no_progress_is_stopped_with_an_error():
    """A child that waits on something that never comes (no CPU time used) is not waited for
    without limit: supervise stops it after ``stalled_after`` seconds and says so."""
    import multiprocessing

    if children.cpu_seconds(os.getpid()) is None:
        pytest.skip("no /proc to read CPU time from")
    proc = multiprocessing.get_context("fork").Process(target=_waits_forever)
    start = time.monotonic()
    with pytest.raises(children.ChildFailed, match="made no progress") as failed:
        children.supervise([proc], 1, stalled_after=1.0)
    assert failed.value.stalled and failed.value.exitcode is None
    assert time.monotonic() - start < 30
    assert not proc.is_alive()
