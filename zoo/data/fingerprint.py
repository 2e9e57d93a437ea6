"""The data's fingerprint: what a fit records of the data it was fitted to, and what a resume
must match (:func:`zoo.training.checkpoint.check_identity`; an HMC chain's checkpoint too).

The fingerprint is the data's size, its tensors' shapes and dtypes, and a SHA-256 digest:

- in-memory ``(X, y)`` (tensors, a two-tensor ``TensorDataset``): every byte, hashed in blocks
  of at most :data:`BLOCK_BYTES` in the tensors' logical order, so a transposed or sliced
  tensor is hashed without a copy of it;
- any other map-style ``Dataset``: every item when reading them all takes less than
  :data:`FULL_READ_SECONDS` (a few seconds; the reading stops at that budget), else
  :data:`SAMPLE_ITEMS` items at evenly spaced indices (``"sample"`` in the fingerprint says
  how many), each hashed with its index, so a relabelled or reordered item among them changes it;
- a data set that defines ``fingerprint()`` (returning a string or bytes: a version, a content
  hash it keeps) gives that, for data only its owner can identify;
- an ``IterableDataset`` gives its type and length only (it cannot be read twice).

Every fit computes it (SHA-256 hashes at about the speed of a memory read) and records it in
``result.options["data"]``, so a saved fit says what it was fitted to.
"""

from __future__ import annotations

import hashlib
import time

import torch
from torch.utils.data import DataLoader, IterableDataset

from zoo.data.forms import as_tensors, split_batch

__all__ = ["BLOCK_BYTES", "FULL_READ_SECONDS", "SAMPLE_ITEMS", "data_fingerprint"]

#: The most bytes of a tensor copied at once to be hashed (a block of rows made contiguous).
BLOCK_BYTES = 16 << 20
#: Seconds a data set's items may take to read in full; a slower data set is sampled.
FULL_READ_SECONDS = 3.0
#: Items hashed of a data set too slow to read in full (evenly spaced, the first and last in).
SAMPLE_ITEMS = 256


def data_fingerprint(data) -> dict:
    """``{"size", "shapes", "digest"}`` (and ``"sample"`` for a sampled data set) of ``data``
    in any form ``zoo.fit`` takes; see the module docstring for what is hashed."""
    if isinstance(data, DataLoader):
        data = data.dataset
    own = getattr(data, "fingerprint", None)
    if callable(own):
        return _own_fingerprint(data, own)
    tensors = as_tensors(data)
    if tensors is None:
        return _dataset_fingerprint(data)
    digest = hashlib.sha256()
    for t in tensors:
        _update(digest, t)
    x, y = tensors
    return {"size": int(x.shape[0]), "shapes": _shapes(x, y), "digest": digest.hexdigest()}


def _own_fingerprint(data, own) -> dict:
    value = own()
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(
            f"{type(data).__name__}.fingerprint() must return a string or bytes that identify "
            f"the data, got {type(value).__name__}"
        )
    size = len(data) if hasattr(data, "__len__") else None
    digest = hashlib.sha256(bytes(value)).hexdigest()
    return {"size": size, "shapes": f"{type(data).__name__}.fingerprint()", "digest": digest}


def _dataset_fingerprint(dataset) -> dict:
    size = len(dataset)
    if isinstance(dataset, IterableDataset):
        return {"size": size, "shapes": type(dataset).__name__, "digest": None}
    digest, shapes, start = hashlib.sha256(), None, time.perf_counter()
    for index in range(size):
        if time.perf_counter() - start > FULL_READ_SECONDS:  # too slow to read in full
            return _sampled_fingerprint(dataset, size)
        shapes = _hash_item(digest, dataset, index, shapes)
    return {"size": size, "shapes": shapes, "digest": digest.hexdigest()}


def _sampled_fingerprint(dataset, size: int) -> dict:
    count = min(size, SAMPLE_ITEMS)
    indices = sorted({round(i * (size - 1) / max(count - 1, 1)) for i in range(count)})
    digest, shapes = hashlib.sha256(), None
    for index in indices:
        shapes = _hash_item(digest, dataset, index, shapes)
    return {"size": size, "shapes": shapes, "digest": digest.hexdigest(), "sample": len(indices)}


def _hash_item(digest, dataset, index: int, shapes):
    """Hash item ``index`` (with its index) into ``digest``; the shapes of the first item."""
    x, y = (torch.as_tensor(t) for t in split_batch(dataset[index]))
    digest.update(f"#{index}|".encode())
    _update(digest, x)
    _update(digest, y)
    return shapes or _shapes(x[None], y[None])


def _shapes(x: torch.Tensor, y: torch.Tensor) -> list:
    return [[list(t.shape[1:]), str(t.dtype).removeprefix("torch.")] for t in (x, y)]


def _update(digest, t: torch.Tensor) -> None:
    """Hash ``t``'s values in their logical (row-major) order: a contiguous CPU tensor in place,
    any other in blocks of rows of at most :data:`BLOCK_BYTES` made contiguous one at a time
    (never a copy of the whole tensor)."""
    t = t.detach()
    digest.update(f"{t.dtype}:{t.numel()}|".encode())
    if not t.numel():
        return
    if t.dim() == 0:
        t = t.reshape(1)
    if t.is_contiguous() and t.device.type == "cpu":
        digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
        return
    row_bytes = max(1, t[0].numel() * t.element_size())
    rows = max(1, BLOCK_BYTES // row_bytes)
    for start in range(0, t.shape[0], rows):
        block = t[start : start + rows].contiguous().cpu()
        digest.update(block.reshape(-1).view(torch.uint8).numpy().data)
