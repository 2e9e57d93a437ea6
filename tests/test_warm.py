"""The tests' warm interpreter (tests/warm.py) runs a script as ``python script`` would."""

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.warm import WarmPython

pytestmark = pytest.mark.slow  # starts interpreters; the harness of the slow tiers' scripts

PROBE = """
import atexit, json, os, sys
import torch
atexit.register(lambda: print("atexit ran"))
print(json.dumps({
    "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
    "variable": os.environ.get("WARM_PROBE"), "threads": torch.get_num_threads(),
    "stdin": sys.stdin.read(),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def warm():
    server = WarmPython(REPO)
    yield server
    server.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not running
        return stat.read().split(") ")[1][0] != "Z"


def test_a_script_sees_what_python_script_gives_it(warm, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "WARM_PROBE": "seen", "PYTHONPATH": str(REPO)}
    cold = subprocess.run([sys.executable, str(script), "3"], cwd=tmp_path, env=env, timeout=120,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    hot = warm.run([str(script), "3"], cwd=tmp_path, env=env, timeout=120)
    assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert hot.returncode == 3 and hot.stdout.endswith("atexit ran\n")
    assert '"name": "__main__"' in hot.stdout and '"variable": "seen"' in hot.stdout
    again = warm.run([str(script), "0"], cwd=tmp_path, env=env, timeout=120)
    assert again.returncode == 0 and '"variable": "seen"' in again.stdout


def test_an_exception_is_printed_and_exits_with_status_one(warm, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("print('before')\nraise ValueError('the probe fails')\n")
    run = warm.run([str(script)], cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and run.stdout == "before\n"
    assert run.stderr.rstrip().endswith("ValueError: the probe fails")


def test_a_run_past_its_time_is_killed_with_its_children_and_the_next_runs(warm, tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open('pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(600)\n"
    )
    ok = tmp_path / "ok.py"
    ok.write_text("print('still warm')\n")
    warm.run([str(ok)], cwd=tmp_path, timeout=120)  # the server's imports are not the script's
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([str(script)], cwd=tmp_path, timeout=4)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "a killed script left a process running"
        time.sleep(0.1)
    assert warm.run([str(ok)], cwd=tmp_path, timeout=120).stdout == "still warm\n"


def test_a_different_thread_count_runs_cold_and_is_seen(warm, tmp_path):
    script = tmp_path / "threads.py"
    script.write_text("import torch\nprint(torch.get_num_threads())\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert warm.run([str(script)], cwd=tmp_path, env=env, timeout=120).stdout == "1\n"
    env["OMP_NUM_THREADS"] = "2"
    assert warm.run([str(script)], cwd=tmp_path, env=env, timeout=120).stdout == "2\n"


def test_a_cold_run_starts_no_server(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('cold')\n")
    fresh = WarmPython(REPO)
    env = {**os.environ, "OMP_NUM_THREADS": str(int(os.environ.get("OMP_NUM_THREADS", 1)) + 1)}
    assert fresh.run([str(script)], cwd=tmp_path, env=env, timeout=120).stdout == "cold\n"
    assert fresh._server is None


def test_closing_ends_the_server_and_a_later_run_starts_another(warm, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ok')\n")
    warm.run([str(script)], cwd=tmp_path, timeout=120)
    server = warm._server
    warm.close()
    assert server.poll() is not None
    assert warm.run([str(script)], cwd=tmp_path, timeout=120).stdout == "ok\n"
