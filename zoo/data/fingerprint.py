"""The data's fingerprint: what a fit records of the data it was fitted to, and what a resume
must match (:func:`zoo.training.checkpoint.check_identity`).

The data's fingerprint is its size, its tensors' shapes and dtypes, and a SHA-256 digest: of
every byte of in-memory ``(X, y)``, or of the first, middle and last items of any other
``Dataset`` (reading them all would cost an epoch; an ``IterableDataset`` gives its length and
type only). Every fit computes it (SHA-256 hashes the bytes in place, at the speed of a memory
read) and records it in ``result.options["data"]``, so a saved fit says what it was fitted to.
"""

from __future__ import annotations

import hashlib

import torch
from torch.utils.data import DataLoader, IterableDataset

from zoo.data.checks import as_tensors, split_batch

__all__ = ["data_fingerprint"]


def data_fingerprint(data) -> dict:
    """``{"size", "shapes", "digest"}`` of ``data`` in any form ``zoo.fit`` takes."""
    if isinstance(data, DataLoader):
        data = data.dataset
    tensors = as_tensors(data)
    if tensors is None:
        return _dataset_fingerprint(data)
    digest = hashlib.sha256()
    for t in tensors:
        _update(digest, t)
    x, y = tensors
    return {"size": int(x.shape[0]), "shapes": _shapes(x, y), "digest": digest.hexdigest()}


def _dataset_fingerprint(dataset) -> dict:
    size = len(dataset)
    if isinstance(dataset, IterableDataset):
        return {"size": size, "shapes": type(dataset).__name__, "digest": None}
    digest, shapes = hashlib.sha256(), None
    for index in sorted({0, size // 2, size - 1}):
        x, y = (torch.as_tensor(t) for t in split_batch(dataset[index]))
        _update(digest, x)
        _update(digest, y)
        shapes = shapes or _shapes(x[None], y[None])
    return {"size": size, "shapes": shapes, "digest": digest.hexdigest()}


def _shapes(x: torch.Tensor, y: torch.Tensor) -> list:
    return [[list(t.shape[1:]), str(t.dtype).removeprefix("torch.")] for t in (x, y)]


def _update(digest, t: torch.Tensor) -> None:
    t = t.detach().contiguous().reshape(-1)
    digest.update(f"{t.dtype}:{t.numel()}|".encode())
    if t.numel():  # hashed in place: no copy of the data
        digest.update(memoryview(t.view(torch.uint8).cpu().numpy()))
