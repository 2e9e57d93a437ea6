"""What ``device="auto"`` means (zoo.runtime.devices): the device ``$ZOO_DEVICE`` names, else CUDA
when there is one; an unusable name and a device that disagrees with the accelerator are refused
with what to pass."""

import pytest
import torch

from zoo.runtime.devices import DEVICE_VARIABLE, chosen_device
from zoo.runtime.distributed import accelerator_for
from zoo.training.recipes import resolve_device


def test_the_variable_says_what_auto_means(monkeypatch):
    monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
    assert chosen_device() == "cpu" and resolve_device("auto") == torch.device("cpu")
    monkeypatch.setenv(DEVICE_VARIABLE, "  ")
    assert chosen_device() is None
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == want
    monkeypatch.setenv(DEVICE_VARIABLE, "tpu9")
    with pytest.raises(ValueError, match=r"\$ZOO_DEVICE='tpu9' is not a usable device"):
        resolve_device("auto")


def test_the_accelerator_agrees_with_what_auto_means(monkeypatch):
    monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
    assert accelerator_for("auto", "auto") == "cpu"
    with pytest.raises(ValueError, match="disagree"):
        accelerator_for("auto", "gpu")
    monkeypatch.delenv(DEVICE_VARIABLE)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no usable CUDA device"):
            accelerator_for("auto", "gpu")
