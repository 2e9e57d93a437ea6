"""Seeding that leaves the caller's random state as it was."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device | str | None = None):
    """Within the block torch's CPU generator (and that of ``device``, when it is a CUDA device)
    starts from ``seed``; afterwards the caller's generator states are back, so results are
    reproducible without resetting the user's global seeds. ``seed=None``: the global
    generators as they are, and they advance as usual. Python's and NumPy's generators are not
    touched (Pyro samples with torch's)."""
    if seed is None:
        yield
        return
    cuda = cuda_indices(device)
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


def cuda_indices(device: torch.device | str | None) -> list[int]:
    """The CUDA generators that work on ``device`` draws from: ``[index]`` for a CUDA device
    (the current one when it names none), ``[]`` for the CPU or ``None``."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def forked(device: torch.device | str | None = None):
    """``torch.random.fork_rng`` over the CPU generator and that of ``device``: draws inside
    the block leave the caller's generator states as they were."""
    return torch.random.fork_rng(devices=cuda_indices(device))
