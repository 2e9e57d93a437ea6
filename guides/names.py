"""The Pyro names of live guides: like ``AutoNormal``'s, ``<ClassName>.sites.<site>.<param>``,
but a second guide of one class alive at once takes the first free suffix, ``<ClassName>_1``,
so that two live guides never share parameters in Pyro's store (:mod:`guides.base`)."""

from __future__ import annotations

import weakref

from pyro.nn import PyroModule

__all__ = ["free_name", "live_guides", "rename"]

#: Every guide alive (held weakly): the names taken.
live_guides: weakref.WeakSet = weakref.WeakSet()


def free_name(base: str) -> str:
    """``base`` if no live guide is named so, else ``base_1``, ``base_2``, ...: the first free.
    No cycle collection here (a fifth of a second in a large process): guides and fit results
    hold no reference cycles (tests/guides/test_guides.py)."""
    taken = {g._pyro_name for g in list(live_guides)}
    k = 0
    while (name := base if k == 0 else f"{base}_{k}") in taken:
        k += 1
    return name


def rename(module: PyroModule, name: str) -> None:
    """Name ``module`` and its Pyro submodules under ``name``."""
    module._pyro_name = name
    for key, child in module._modules.items():
        if isinstance(child, PyroModule):
            rename(child, f"{name}.{key}")
