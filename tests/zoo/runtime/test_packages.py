"""zoo.runtime.packages: the tested torch pair, its install commands, and a torchvision that does
not work with the imported torch named as such."""

import subprocess
import sys

import pytest

import zoo
from tests.conftest import HANG_AFTER, REPO
from zoo.runtime import packages


def test_the_install_commands_name_the_tested_pair_inside_the_project_bounds():
    torch_version, vision_version = packages.TESTED_PAIR
    for command in (packages.CPU_INSTALL, packages.GPU_INSTALL):
        assert f'"torch=={torch_version}"' in command
        assert f'"torchvision=={vision_version}"' in command
    assert packages.CPU_INSTALL.endswith("--index-url https://download.pytorch.org/whl/cpu")
    assert packages.pair_mismatch(torch_version, vision_version) is None
    text = (REPO / "pyproject.toml").read_text()
    assert '"torch>=2.11,<2.15"' in text and '"torchvision>=0.26,<0.30"' in text
    assert (2, 11) <= packages._release(torch_version) < (2, 15)
    assert (0, 26) <= packages._release(vision_version) < (0, 30)


@pytest.mark.parametrize(
    "torch_version,vision_version,bad",
    [("2.14.1+cpu", "0.29.1+cpu", False), ("2.11.0", "0.26.0", False),
     ("2.14.1", "0.26.0", True), ("2.11.0+cu130", "0.29.1", True)],
)  # fmt: skip
def test_a_pair_of_other_releases_is_named(torch_version, vision_version, bad):
    why = packages.pair_mismatch(torch_version, vision_version)
    assert (why is not None) == bad
    if bad:
        assert vision_version in why and torch_version in why


def test_this_environment_has_a_working_pair():
    assert packages.torchvision_problem() is None
    assert packages.torchvision_datasets().MNIST.__name__ == "MNIST"


def test_a_missing_torchvision_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(packages.BrokenTorchvisionError, match="matching pair.*whl/cpu"):
        zoo.data.mnist(download=False)


@pytest.mark.slow  # two child processes
def test_a_torchvision_built_for_another_torch_is_named_by_mnist_and_info(tmp_path):
    """A torchvision whose compiled operators do not fit the imported torch raises
    ``operator torchvision::nms does not exist`` at import (seen with a pair pip chose without
    PyTorch's index): ``zoo.data.mnist`` and ``python -m zoo info`` name the pair and the
    commands that install one that works."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    load = subprocess.run(
        [sys.executable, "-c", "import zoo; zoo.data.mnist(download=False)"],
        capture_output=True, text=True, timeout=HANG_AFTER, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert load.returncode == 1
    last = load.stderr.strip().splitlines()[-1]
    assert last.startswith("zoo.runtime.packages.BrokenTorchvisionError: torchvision "), last
    assert "does not work with torch" in last and packages.CPU_INSTALL in last
    info = subprocess.run(
        [sys.executable, "-m", "zoo", "info"],
        capture_output=True, text=True, timeout=HANG_AFTER, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert info.returncode == 1, info.stdout + info.stderr
    assert "torch + torchvision:" in info.stdout and "not a working pair" in info.stdout
    assert "torchvision::nms does not exist" in info.stdout
    assert packages.CPU_INSTALL in info.stdout


def test_the_readme_and_install_page_print_the_cpu_route_and_info():
    """The commands a newcomer without a GPU runs are printed whole where they look first."""
    for page in ("README.md", "docs/install.md"):
        text = (REPO / page).read_text()
        assert packages.CPU_INSTALL in text, page
        assert "python -m zoo info" in text, page
    assert "python -m zoo info" in (REPO / "docs" / "troubleshooting.md").read_text()


@pytest.mark.slow  # child processes
@pytest.mark.parametrize(
    "code",
    [
        "import zoo.lightning",
        "import torch, zoo; zoo.laplace(zoo.models.BayesianMLP(2, (3,)), "
        "(torch.randn(8, 2), torch.randint(0, 2, (8,))), at='module')",
    ],
    ids=["lightning", "laplace"],
)
def test_every_route_to_torchvision_names_a_broken_one(tmp_path, code):
    """laplace-torch and Lightning import torchvision: a torchvision of another torch is named
    by the one check (BrokenTorchvisionError), not by torchvision's raw operator error."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_AFTER, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("zoo.runtime.packages.BrokenTorchvisionError: zoo."), last
    assert "does not work with torch" in last and packages.CPU_INSTALL in last
