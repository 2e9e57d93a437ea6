"""Weight draws in blocks of bounded memory: how a prediction goes through ``S`` draws.

A prediction with ``S`` sampled networks never holds all ``S`` weight draws at once: it draws
(or, for a posterior of stored draws, selects) them in blocks of at most
:func:`draws_per_block` draws, whose weights take at most :data:`DRAW_MEMORY` bytes, runs the
network on each block and keeps only the block's outputs. A block is one draw when a single
draw is larger than the budget.

The blocks are a property of the model, never of the machine: the block size depends only on
the bytes of one draw and on the constant :data:`DRAW_MEMORY`, and block ``j`` of a seeded call
is seeded with :func:`block_seed` ``(seed, j)`` (block 0 with ``seed`` itself), so a seeded
prediction is the same on every machine, and the same as ``sample`` with that seed followed by
``predict_draws``. When every draw fits in one block (``S`` times a draw's bytes within the
budget), the draws are those of one ``sample(S)`` call with that seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

__all__ = [
    "DRAW_MEMORY",
    "block_seed",
    "block_sizes",
    "draw_bytes",
    "draws_per_block",
    "held_per_block",
    "sliced",
]

#: Bytes of weight draws a prediction holds at once (128 MiB; drawing a block takes about as
#: much again for its noise).
DRAW_MEMORY = 128 << 20

#: An odd 63-bit constant (the golden ratio's): consecutive blocks' seeds far apart.
_STRIDE = 0x4F1BBCDCBFA53E0B
_MODULUS = 1 << 63


def draw_bytes(shapes: dict[str, tuple[int, ...]], element_size: int = 4) -> int:
    """Bytes of one joint draw of sites of ``shapes`` (``{site: shape}``) with elements of
    ``element_size`` bytes."""
    return sum(math.prod(shape) for shape in shapes.values()) * element_size


def draws_per_block(bytes_per_draw: int, budget: int | None = None) -> int:
    """The most draws of ``bytes_per_draw`` bytes each that ``budget`` bytes hold, at least
    one."""
    budget = DRAW_MEMORY if budget is None else budget
    return max(1, budget // max(int(bytes_per_draw), 1))


def held_per_block(draws: dict[str, torch.Tensor]) -> int:
    """:func:`draws_per_block` for draws already held, ``{site: (S, *site_shape)}``."""
    shapes = {k: tuple(v.shape[1:]) for k, v in draws.items()}
    return draws_per_block(draw_bytes(shapes, next(iter(draws.values())).element_size()))


def block_sizes(num_samples: int, per_block: int) -> list[int]:
    """``num_samples`` draws as consecutive blocks of ``per_block`` (the last may be
    smaller)."""
    full, rest = divmod(num_samples, per_block)
    return [per_block] * full + ([rest] if rest else [])


def block_seed(seed: int | None, index: int) -> int | None:
    """The seed of block ``index`` of a call seeded ``seed``: ``seed`` itself for block 0,
    then a fixed scramble of ``(seed, index)`` (``None`` stays ``None``: the global
    generators, which advance from block to block)."""
    if seed is None or index == 0:
        return seed
    return (seed + index * _STRIDE) % _MODULUS


def sliced(draws: dict[str, torch.Tensor], per_block: int) -> Iterator[dict[str, torch.Tensor]]:
    """Held ``draws`` (``{site: (S, ...)}``) as views of ``per_block`` draws each."""
    total = next(iter(draws.values())).shape[0]
    for start in range(0, total, per_block):
        yield {k: v[start : start + per_block] for k, v in draws.items()}
