"""Checks of a network's layer sizes before any weight is allocated: each size a whole number
of at least 1, and the whole within this machine's memory (a width of ``10**6`` reached the
allocator, which asked for terabytes)."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["BYTES_PER_WEIGHT", "check_sizes"]

#: Bytes a fit holds per weight, at least: the network's float32 placeholder and a guide's
#: location and scale (each family has two or more parameters per weight).
BYTES_PER_WEIGHT = 12


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_sizes(name: str, sizes: Sequence, weights: int | None = None) -> None:
    """Refuse sizes (``name`` says which argument) that are not whole numbers >= 1, and a
    network of ``weights`` weights (default: a chain of linear layers through ``sizes``) that
    would not fit in this machine's memory at :data:`BYTES_PER_WEIGHT` bytes a weight."""
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be whole numbers of at least 1, got {list(sizes)}")
    if weights is None:
        weights = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
    memory = _memory_bytes()
    if memory is not None and weights * BYTES_PER_WEIGHT > memory:
        raise ValueError(
            f"{name} {list(sizes)} make a network of {weights:.3g} weights, which needs at least "
            f"{weights * BYTES_PER_WEIGHT / 2**30:,.0f} GiB to fit ({BYTES_PER_WEIGHT} bytes a "
            f"weight) where this machine has {memory / 2**30:,.0f} GiB; use smaller layers"
        )
