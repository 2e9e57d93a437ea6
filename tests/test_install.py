"""Installing the project over a torch already installed keeps that torch: ``pyproject.toml``'s
ranges admit the pair this environment runs (a CPU build a user installed first, say), so pip
plans to install the project alone, not a CUDA torch of another release."""

import json
import subprocess
import sys

import pytest

from tests.conftest import HANG_AFTER, REPO

pytestmark = pytest.mark.slow  # installs the project in a fresh environment

#: Packages an install over a working environment must not plan to (re)install.
KEPT = ("torch", "torchvision", "pyro-ppl", "triton")


def test_installing_the_project_keeps_the_installed_torch(tmp_path):
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            "-e",
            f"{REPO}[dev]",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    if run.returncode != 0 and "No matching distribution" in run.stderr + run.stdout:
        pytest.skip(f"no package index reachable: {run.stderr.strip()[-300:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    planned = {
        item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]
    }
    replaced = sorted(name for name in planned if name in KEPT or name.startswith("nvidia-"))
    assert not replaced, f"pip would replace {replaced} (planned: {sorted(planned)})"
    assert "bnn-zoo" in planned
