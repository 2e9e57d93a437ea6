"""Seeding that leaves the caller's random state as it was, and a word when another thread may
draw from the seeded generator.

Pyro and torch draw from one process-wide generator: a seeded call forks it and seeds it, so a
draw another thread makes meanwhile (building a model initialises its layers from it) comes
out of that call's stream and changes its results. :func:`warn_if_seeded_elsewhere` says so,
once per process, when a zoo model is built in one thread while another thread's seeded call
runs: the sweep ``pool.map(lambda s: zoo.fit(make_model(), ..., seed=s), seeds)`` builds each
model in that window. Build the models first, then start the threads
(``docs/guide/saving.md``, "Threads and child processes"). A network built outside the zoo's
classes draws the same way, unseen here.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings

import torch

#: Threads inside a seeded block now (their idents).
_SEEDED: set[int] = set()
_WARNED = threading.Event()
if hasattr(os, "register_at_fork"):  # a forked child has one thread: none of these
    os.register_at_fork(after_in_child=_SEEDED.clear)


class SeededElsewhereWarning(UserWarning):
    """A model was built (it drew from torch's global generator) while another thread's
    seeded call was using that generator as its stream."""


def warn_if_seeded_elsewhere(what: str = "a bnn-zoo call") -> None:
    """Warn once per process when ``what`` (a draw from the global generator: a model being
    built) happens in this thread while another thread is inside a seeded call (see the module
    docstring)."""
    if _WARNED.is_set() or not (_SEEDED - {threading.get_ident()}):
        return
    _WARNED.set()
    warnings.warn(
        f"{what} while another thread's seeded call runs: torch's global generator is that "
        "call's stream, so the draws made here (a model initialises its layers from it) "
        "changed that call's results, which its seed no longer reproduces. Build the models "
        "before starting the threads, e.g. models = [make_model() for s in seeds]; "
        "pool.map(lambda m, s: zoo.fit(m, ..., seed=s), models, seeds) (docs/guide/saving.md, "
        "'Threads and child processes')",
        SeededElsewhereWarning,
        stacklevel=3,
    )


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
    cuda, me = cuda_indices(device), threading.get_ident()
    outer = me in _SEEDED
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        _SEEDED.add(me)
        try:
            yield
        finally:
            if not outer:
                _SEEDED.discard(me)


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
