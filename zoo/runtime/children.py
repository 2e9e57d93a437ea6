"""Child processes that end with their parent, and temporary folders that outlive neither.

A forked HMC chain (:mod:`zoo.mcmc.sampling`) or a spawned rank of a distributed fit
(:mod:`zoo.runtime.distributed`) calls :func:`die_with_parent` first: on Linux the kernel sends it
``SIGKILL`` when the parent dies (``prctl(PR_SET_PDEATHSIG)``), elsewhere a daemon thread
notices the parent is gone within :data:`WATCH_EVERY` seconds and ends the process. A parent
killed with ``SIGKILL`` runs no clean-up of its own, so nothing else could stop them: they went
on sampling and writing into the checkpoint folder, where a resumed run then wrote the same
files.

:func:`scratch_folder` makes a temporary folder named for its process and holds an exclusive
lock on a file in it (``flock``) for as long as it is in use; :func:`remove_orphans` removes,
at the next run, the folders whose lock nobody holds (a killed run's: the kernel releases its
locks). The lock, not the process id, says whether a folder is in use: a run in another PID
namespace that shares ``/tmp`` (a container) has ids that mean nothing here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "WATCH_EVERY",
    "ChildFailed",
    "alive",
    "holding",
    "in_use",
    "orphaned",
    "die_with_parent",
    "cpu_seconds",
    "remove_orphans",
    "scratch_folder",
    "supervise",
]

#: Seconds between a child's checks that its parent is alive, where the kernel cannot tell it.
WATCH_EVERY = 0.5
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent`` (the one that started it) ends."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    watcher = threading.Thread(target=_watch, args=(parent,), daemon=True, name="zoo-parent")
    watcher.start()


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCH_EVERY)
        if os.getppid() != parent:
            os._exit(1)


class ChildFailed(RuntimeError):
    """Child ``index`` of :func:`supervise` ended with a non-zero ``exitcode``, or made no
    progress for ``stalled`` seconds (then ``exitcode`` is ``None``: it was stopped)."""

    def __init__(self, index: int, exitcode: int | None, stalled: float | None = None):
        what = (
            f"made no progress for {stalled:.0f} s"
            if stalled
            else f"ended with exit code {exitcode}"
        )
        super().__init__(f"process {index} {what}")
        self.index, self.exitcode, self.stalled = index, exitcode, stalled


#: Seconds a supervised child may run without using any CPU time before it is taken to wait on
#: something that will not come (a lock, a pipe) and stopped with an error.
STALLED_AFTER = 300.0


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) process ``pid`` has used, from ``/proc`` (``None`` where it
    cannot be read: another platform, a process gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def supervise(
    procs: list, workers: int, tick=None, every: float = 0.2, stalled_after: float = STALLED_AFTER
) -> None:
    """Start the (not yet started) processes ``procs`` ``workers`` at a time and wait for all
    of them, calling ``tick()`` every ``every`` seconds. The first to end with a non-zero exit
    code raises :class:`ChildFailed`; so does one that uses no CPU time for ``stalled_after``
    seconds (it waits on something that will not come: the wait has a limit). Whatever way this
    returns or raises (Ctrl-C included), no process of ``procs`` is left running."""
    pending, running = list(procs), list[Any]()
    progress: dict[int, tuple[float | None, float]] = {}  # pid -> (CPU seconds, since when)
    try:
        while pending or running:
            while pending and len(running) < workers:
                running.append(pending.pop(0))
                running[-1].start()
            time.sleep(every)
            if tick is not None:
                tick()
            now = time.monotonic()
            for p in running:
                used = cpu_seconds(p.pid)
                last, since = progress.get(p.pid, (None, now))
                if used is None or used != last:
                    progress[p.pid] = (used, now)
                elif now - since > stalled_after and p.is_alive():
                    raise ChildFailed(procs.index(p), None, stalled=now - since)
            for p in [p for p in running if not p.is_alive()]:
                p.join()
                running.remove(p)
                if p.exitcode != 0:
                    raise ChildFailed(procs.index(p), p.exitcode)
    finally:
        for p in running:
            p.terminate()
            p.join()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Seconds during which something just made is never taken as orphaned (its lock is taken a
#: moment after it is made).
LOCK_GRACE = 10.0
#: The file whose lock says that a scratch folder is in use.
OWNER_LOCK = ".owner.lock"
#: Seconds after which a folder or temporary file without a lock file (a run of an earlier
#: version, or one that is being made) whose process id is not alive here is taken as orphaned.
UNLOCKED_STALE_AFTER = 600.0


@contextlib.contextmanager
def holding(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) for the block; where the platform
    has no ``flock``, a plain block. The kernel releases it when this process ends, however."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the process-id test alone applies
        yield
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def in_use(path: Path) -> bool | None:
    """Whether another open file holds ``path``'s lock (``True``), nobody does (``False``), or
    it cannot be told (``None``: no such file, or no ``flock`` here)."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def orphaned(lock: Path, pid: str, made: float) -> bool:
    """Whether what ``lock`` guards (a scratch folder, a file being written) was left by a
    killed run: it is older than :data:`LOCK_GRACE` seconds and its lock is held by nobody;
    without a lock file, its process ``pid`` is not
    alive here and it is older than :data:`UNLOCKED_STALE_AFTER` seconds (``made``: its
    modification time)."""
    age = time.time() - made
    if age < LOCK_GRACE:  # being made: its lock may not be taken yet
        return False
    held = in_use(lock)
    if held is not None:
        return not held
    old = age > UNLOCKED_STALE_AFTER
    return old and pid.isdigit() and not alive(int(pid))


def remove_orphans(prefix: str, folder: str | None = None) -> list[Path]:
    """Remove the ``<folder>/<prefix><pid>-*`` folders that no live run holds (see
    :func:`orphaned`); returns them (``folder``: the system's temporary folder)."""
    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        try:
            if path.is_dir() and orphaned(path / OWNER_LOCK, pid, path.stat().st_mtime):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:  # removed meanwhile by its owner or another run
            continue
    return removed


@contextlib.contextmanager
def scratch_folder(prefix: str):
    """A temporary folder ``<prefix><pid>-XXXX`` for this process, locked while in use and
    removed afterwards; the orphans of killed runs of the same prefix are removed first."""
    remove_orphans(prefix)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-") as folder:
        with holding(Path(folder) / OWNER_LOCK):
            yield folder
