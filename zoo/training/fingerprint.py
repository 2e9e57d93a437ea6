"""What a checkpoint was made with, so that a resume continues the same fit: the data's
fingerprint and the settings that change what a step computes.

A resumed fit replays its epoch's shuffle and takes the steps the interrupted one would have
taken; that holds only on the same data, in minibatches of the same size, with the same
objective and optimiser. :func:`fit_identity` records those in the checkpoint and
:func:`check_identity` refuses a resume whose identity differs, naming what differs. What may
change on a resume: the length (``num_steps``, ``epochs``: a longer run goes on), the progress
bar, callbacks, the checkpoint cadence, the threads, ``jit``, and the number of processes (a
distributed fit resumed on another layout draws fresh weights, :mod:`zoo.training.checkpoint`).

The data's fingerprint is its size, its tensors' shapes and dtypes, and a SHA-256 digest: of
every byte of in-memory ``(X, y)``, or of the first, middle and last items of any other
``Dataset`` (reading them all would cost an epoch; an ``IterableDataset`` gives its length and
type only). Every fit computes it (SHA-256 hashes the bytes in place, at the speed of a memory
read) and records it in ``result.options["data"]``, so a saved fit says what it was fitted to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader, IterableDataset

from zoo.data.checks import as_tensors, split_batch

__all__ = ["check_identity", "data_fingerprint", "fit_identity"]


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


def fit_identity(data_print: dict, batch_size: int, length, optim, loss, engine) -> dict:
    """The identity a checkpoint records: ``data`` (:func:`data_fingerprint`) and ``settings``
    (the values of ``zoo.fit``'s arguments that change what a step computes; a callable
    schedule or KL weight is recorded as ``"callable"``, which cannot be compared further)."""
    from zoo.runtime.files import plain_data

    optimizer = optim.optimizer
    settings = {
        "batch_size": int(batch_size),
        "lr": float(length.lr),
        "optimizer": optimizer if isinstance(optimizer, str) else optimizer.__name__,
        "optimizer_options": plain_data(dict(optim.optimizer_options or {})),
        "lr_schedule": _named(length.lr_schedule),
        "lr_multipliers": plain_data(dict(optim.lr_multipliers or {})),
        "clip_grad_norm": optim.clip_grad_norm,
        "per_example": bool(optim.per_example),
        "elbo": loss.elbo,
        "estimator": loss.estimator,
        "num_particles": int(loss.num_particles),
        "kl_weight": _named(loss.kl_weight),
        "accumulate": int(engine.accumulate),
    }
    return {"data": data_print, "settings": settings}


def _named(value):
    return "callable" if callable(value) else value


def check_identity(path, saved: Mapping | None, now: Mapping) -> None:
    """Refuse to resume the checkpoint at ``path`` (identity ``saved``; ``None`` for a
    checkpoint written before identities were recorded, which is not checked) as a fit whose
    identity is ``now``: a ``ValueError`` naming every difference."""
    if saved is None:
        return
    differ = []
    old, new = saved.get("settings", {}), now["settings"]
    for key in new:
        if key in old and old[key] != new[key]:
            differ.append(f"{key}={old[key]!r} in the checkpoint, {new[key]!r} now")
    data_old, data_new = saved.get("data"), now["data"]
    if data_old is not None and data_old != data_new:
        what = (
            f"{data_old['size']} examples in the checkpoint, {data_new['size']} now"
            if data_old.get("size") != data_new.get("size")
            else "the same size, other values or shapes"
        )
        differ.append(f"the data differ ({what})")
    if differ:
        raise ValueError(
            f"resume={str(path)!r} was written by a fit with other settings: "
            + "; ".join(differ)
            + ". A resumed fit continues the same fit: pass the same data and settings to "
            "resume it (only num_steps, epochs, progress, callbacks, checkpoint_every, threads "
            "and jit may change), or drop resume= to start a new fit"
        )
