"""A warm interpreter for the scripts the tests run: ``python script args`` without paying the
interpreter's start-up (torch, Pyro, the library and torchmetrics imported) every time.

One server process per pytest worker imports those once and does nothing else, so it holds one
thread and no state a script could see. For each script it forks a child that becomes what
``python script args`` would be: its own session (a timeout kills it and everything it started),
the folder, environment, ``sys.argv`` and ``sys.path[0]`` of that command, standard input from
``/dev/null``, its output in files, ``__name__ == "__main__"`` (``runpy``), and a normal exit
(``atexit`` runs). A script whose environment differs in what is read at import (the thread
counts, ``PYTHONPATH``, matplotlib's backend) runs cold, as a plain subprocess, so no run sees
the server's choice.
"""

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Environment variables read when the interpreter starts or at the server's imports (torch's
#: threads; matplotlib's backend, which torchmetrics imports): a run that sets them differently
#: from the server runs cold.
READ_AT_START = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH", "PYTHONHASHSEED", "MPLBACKEND")

SERVER = r"""
import json, os, runpy, sys
import torch, pyro, torchmetrics, zoo, guides  # noqa: F401  what the scripts import first

for line in iter(sys.stdin.readline, ""):
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        targets = [(os.devnull, os.O_RDONLY), (request["out"], written), (request["err"], written)]
        for fd, (path, flags) in enumerate(targets):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
        break  # the script returned: exit as an interpreter does at the end of a script
    sys.stdout.write(json.dumps({"pid": pid}) + "\n")
    sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    sys.stdout.flush()
"""


class WarmPython:
    """The server of one pytest worker, started on first use and ended when the worker ends;
    ``path`` comes first on its ``sys.path`` (``PYTHONPATH``), as in every run it makes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._env: dict[str, str] = {}
        self._pending = b""
        atexit.register(self.close)

    def _running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def _served(self) -> dict[str, str]:
        """The environment the server has, or the one it would start with now."""
        return self._env if self._running() else {**os.environ, "PYTHONPATH": str(self.path)}

    def _start(self) -> subprocess.Popen:
        if not self._running():
            self._pending = b""
            self._env = self._served()
            self._server = subprocess.Popen(
                [sys.executable, "-c", SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._env,
            )
        return self._server

    def close(self) -> None:
        """End the server (its children have ended: each run waits for its own)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()

    def _reply(self, server: subprocess.Popen, timeout: float) -> dict | None:
        """The server's next line, or None when ``timeout`` seconds pass first (read unbuffered,
        so a line already sent is never left waiting in a buffer ``select`` cannot see)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = max(0.0, deadline - time.monotonic())  # select refuses a negative wait
            ready, _, _ = select.select([server.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(server.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the warm interpreter ended (exit status {server.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(
        self, argv: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """``python *argv`` in ``cwd`` with ``env`` (this process's when None) and ``PYTHONPATH``
        set to :attr:`path`: its exit status and text output, as ``subprocess.run(...,
        capture_output=True, text=True)`` returns them. A run past ``timeout`` seconds is
        killed with everything it started and raises :class:`subprocess.TimeoutExpired`."""
        env = {**(os.environ if env is None else env), "PYTHONPATH": str(self.path)}
        with self._lock:
            served = self._served()  # a run that goes cold starts no server
            if any(env.get(k) != served.get(k) for k in READ_AT_START):
                return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, timeout=timeout,
                                      capture_output=True, text=True)  # fmt: skip
            server = self._start()
            with tempfile.TemporaryDirectory() as folder:
                out, err = Path(folder, "out"), Path(folder, "err")
                request = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out)}
                server.stdin.write(json.dumps({**request, "err": str(err)}).encode() + b"\n")
                server.stdin.flush()
                forked = self._reply(server, timeout)
                if forked is None:
                    self.close()
                    raise RuntimeError("the warm interpreter did not start the script")
                done = self._reply(server, timeout)
                if done is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(forked["pid"], signal.SIGKILL)
                    self._reply(server, timeout)
                    raise subprocess.TimeoutExpired(argv, timeout, out.read_text(),
                                                    err.read_text())  # fmt: skip
                return subprocess.CompletedProcess(
                    argv, done["returncode"], out.read_text(), err.read_text()
                )


#: This worker's warm interpreter.
WARM = WarmPython(Path(__file__).resolve().parents[1])
