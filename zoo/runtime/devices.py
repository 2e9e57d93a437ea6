"""What ``device="auto"`` means in this process: the device the environment variable
``ZOO_DEVICE`` names (``cpu``, ``cuda``, ``cuda:1``) when it is set, else CUDA when there is
one. A CPU-only run on a GPU machine, without a change to the code: ``ZOO_DEVICE=cpu`` (the
test suite sets it); the processes a run starts inherit it."""

from __future__ import annotations

import os

__all__ = ["DEVICE_VARIABLE", "chosen_device"]

#: The environment variable that says what ``device="auto"`` means.
DEVICE_VARIABLE = "ZOO_DEVICE"


def chosen_device() -> str | None:
    """The device ``$ZOO_DEVICE`` names, or ``None`` when it is unset or empty."""
    return os.environ.get(DEVICE_VARIABLE, "").strip() or None
