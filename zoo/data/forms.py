"""The forms of data the library takes, in one place: ``(x, y)`` tensors (a tuple or a list of
two; a two-tensor ``TensorDataset`` is read as them), a map-style ``Dataset`` of ``(x, y)``
items, an ``IterableDataset``, or a ``DataLoader`` of ``(x, y)`` batches over any of them.

What every entry point asks of a form is answered here: its tensors (:func:`as_tensors`,
:func:`gather_tensors`), its length (:func:`size`), its batches an epoch (:func:`batches_per_epoch`)
and its size in memory before it is read (:func:`nbytes`). The checks of what the data hold are
:mod:`zoo.data.checks`'."""

from __future__ import annotations

import math
from collections.abc import Sized
from typing import cast

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

#: The data every entry point takes: ``(x, y)`` tensors (a tuple or a list of two), a ``Dataset``
#: of ``(x, y)`` items (a ``TensorDataset`` of two tensors is read as the tensors), or a
#: ``DataLoader`` of ``(x, y)`` batches.
Data = tuple[torch.Tensor, torch.Tensor] | list[torch.Tensor] | Dataset | DataLoader

__all__ = [
    "Data",
    "as_tensors",
    "batches_per_epoch",
    "dataset_of",
    "gather_tensors",
    "locate_bad_item",
    "nbytes",
    "size",
    "split_batch",
]


def as_tensors(data) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(X, y)`` for a tuple/list of two tensors or a two-tensor ``TensorDataset``, else None."""
    if isinstance(data, TensorDataset):
        if len(data.tensors) != 2:
            raise ValueError(
                f"a TensorDataset for fit must hold (X, y), got {len(data.tensors)} tensors"
            )
        data = data.tensors
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise ValueError(f"data must be (X, y), got a sequence of {len(data)} items")
        x, y = data
        if not (torch.is_tensor(x) and torch.is_tensor(y)):
            raise TypeError(
                f"(X, y) must both be torch tensors, got ({type(x).__name__}, "
                f"{type(y).__name__}); convert with torch.as_tensor"
            )
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"X and y have different lengths: {x.shape[0]} inputs but {y.shape[0]} targets; "
                "they must have one target per input"
            )
        return x, y
    if isinstance(data, (Dataset, DataLoader)):
        return None
    raise TypeError(
        f"data must be (X, y) tensors, a torch Dataset or a DataLoader, got {type(data).__name__}"
    )


def gather_tensors(data, batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """All of ``data`` as two tensors ``(X, y)``, whatever its form: ``(X, y)`` and a two-tensor
    ``TensorDataset`` as they are, any other ``Dataset`` or a ``DataLoader`` read in order
    (batches of ``batch_size`` for a ``Dataset``) and concatenated. For evaluation and ArviZ
    groups, which need every example at once."""
    tensors = as_tensors(data)
    if tensors is not None:
        return tensors
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    pairs, offset, items = [], 0, iter(loader)
    while True:
        try:
            batch = next(items)
        except StopIteration:
            break
        except Exception as err:  # an item that raises, or items that do not stack: name it
            dataset = loader.dataset
            if not isinstance(dataset, IterableDataset):
                size = loader.batch_size or 1
                end = min(offset + size, len(cast(Sized, dataset)))
                locate_bad_item(dataset, offset, end, err)
            raise
        pairs.append(split_batch(batch))
        offset += pairs[-1][0].shape[0]
    if not pairs:
        raise ValueError("the data set is empty: it has no examples to gather")
    xs, ys = zip(*pairs)
    return torch.cat(xs), torch.cat(ys)


def dataset_of(data):
    """The ``Dataset`` under a ``DataLoader``, else ``data`` itself."""
    return data.dataset if isinstance(data, DataLoader) else data


def size(data) -> int | None:
    """The number of examples of ``data`` in any form ``fit`` takes, or ``None`` when it has no
    length (an ``IterableDataset``) or the form is not one the library knows (its checks say
    so)."""
    data = dataset_of(data)
    if isinstance(data, (tuple, list)):
        first = data[0] if len(data) == 2 else None
        return int(first.shape[0]) if torch.is_tensor(first) and first.dim() else None
    if isinstance(data, IterableDataset) or not isinstance(data, Dataset):
        return None
    try:
        return len(cast(Sized, data))
    except TypeError:  # a map-style Dataset without __len__
        return None


def batches_per_epoch(data, batch_size: int) -> int | None:
    """Minibatches in one pass over ``data``: a ``DataLoader``'s own length, else
    ``ceil(size / batch_size)`` (``None`` without a length)."""
    if isinstance(data, DataLoader):
        return len(data)
    n = size(data)
    return None if n is None else math.ceil(n / batch_size)


def nbytes(data) -> int | None:
    """Bytes of ``data`` held as tensors, known before it is read: the tensors' own, or for a
    map-style ``Dataset`` (under a ``DataLoader`` too) its first item's times its length;
    ``None`` for an ``IterableDataset`` (no length) or an unknown form."""
    tensors = as_tensors(data) if not isinstance(data, DataLoader) else None
    if tensors is not None:
        return sum(t.numel() * t.element_size() for t in tensors)
    dataset = dataset_of(data)
    if isinstance(dataset, TensorDataset):
        return sum(t.numel() * t.element_size() for t in dataset.tensors)
    if isinstance(dataset, Dataset) and not isinstance(dataset, IterableDataset):
        count = len(cast(Sized, dataset))  # a map-style dataset has a length
        if count == 0:
            return 0
        first = dataset[0]
        item = sum(torch.as_tensor(t).numel() * torch.as_tensor(t).element_size() for t in first)
        return item * count
    return None


def locate_bad_item(dataset, start: int, stop: int, err: Exception) -> None:
    """Raise a ``ValueError`` naming the first item in ``dataset[start:stop]`` that raises,
    is not an ``(x, y)`` pair, or has other shapes than ``dataset[start]`` (so a batch could not
    be stacked); return if none does (``err`` is then re-raised by the caller)."""
    first = None
    for index in range(start, stop):
        try:
            item = dataset[index]
        except Exception as cause:
            raise ValueError(
                f"item {index} of the data set raised {type(cause).__name__}: {cause}; fix the "
                "Dataset's __getitem__ (or drop that item) before fitting"
            ) from cause
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(
                f"item {index} of the data set is a {type(item).__name__}, not an (x, y) pair; "
                "a Dataset for fit returns (input, target) from __getitem__"
            )
        shapes = tuple(tuple(getattr(part, "shape", ())) for part in item)
        if first is None:
            first = shapes
        elif shapes != first:
            raise ValueError(
                f"item {index} of the data set has shapes x {shapes[0]}, y {shapes[1]}, where item "
                f"{start} has x {first[0]}, y {first[1]}; every item needs the same shapes "
                f"(the batches stack them): resize or drop item {index} ({err})"
            )


def split_batch(batch) -> tuple:
    """``(x, y)`` of a batch of a ``DataLoader``, refused unless it is a pair."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError("each batch of the data must be a pair (x, y)")
