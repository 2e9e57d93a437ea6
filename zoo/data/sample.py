"""A few examples of data in any form ``zoo.fit`` takes, read without moving any generator."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, IterableDataset, Subset

from zoo.data.forms import as_tensors, split_batch


def sample_examples(data, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` examples ``(x, y)`` of ``data`` (all of them when fewer), drawn without
    replacement by a generator of their own seeded ``seed``: the global generators and a
    loader's own do not move. ``data`` is ``(X, y)``, a ``Dataset`` or a ``DataLoader`` (its
    ``collate_fn`` assembles the sample); an ``IterableDataset``, which cannot be indexed,
    gives its first ``count``.

    Raises
    ------
    ValueError, TypeError
        As :func:`zoo.data.checks.as_tensors` for a malformed pair, or a batch that is not a
        pair ``(x, y)``.
    """
    order = torch.Generator().manual_seed(seed)
    tensors = as_tensors(data)
    if tensors is not None:
        x, y = tensors
        picked = torch.randperm(len(x), generator=order)[:count]
        return x[picked.to(x.device)], y[picked.to(y.device)]
    collate = data.collate_fn if isinstance(data, DataLoader) else None
    items = data.dataset if isinstance(data, DataLoader) else data
    if not isinstance(items, IterableDataset):
        picked = torch.randperm(len(items), generator=order)[:count]  # type: ignore[arg-type]
        items = Subset(items, picked.tolist())
    probe = DataLoader(items, batch_size=count, collate_fn=collate, generator=order)
    return split_batch(next(iter(probe)))
