"""What a file must hold before anything is built from it: its checksum, its entries, the
guide's declared sizes (checked before any allocation), and its tensors' dtypes and values.

Every file of this version carries a SHA-256 ``checksum`` of its payload (:func:`digest`:
every tensor's dtype, shape and bytes, every number and string, in key order), written by
:func:`zoo.storage.files.atomic_save` and compared by :func:`zoo.storage.files.read`: a byte
changed on disk that still unpickles (a weight of ``9.96e33``, ``0xff`` bytes that read as NaN) is
refused as damaged instead of loading as a wrong fit. A file written before checksums were
recorded is read without one. Each failure is a ``ValueError`` naming the file and the entry.
"""

from __future__ import annotations

import hashlib
import math

import torch

from zoo.arguments import is_int

__all__ = [
    "MAX_ELEMENTS",
    "check_state",
    "check_tensors",
    "count_elements",
    "digest",
    "verify",
]

#: The most elements a file may declare for one input or site (2**31, 8 GiB of float32): a
#: size past it is a damaged or hostile file, refused before anything is allocated.
MAX_ELEMENTS = 2**31


def digest(payload) -> str:
    """The SHA-256 of ``payload`` (nested dicts, lists, tensors, numbers, strings, None)."""
    h = hashlib.sha256()
    _feed(h, payload)
    return h.hexdigest()


def _feed(h, value) -> None:
    if isinstance(value, dict):
        h.update(b"{%d" % len(value))
        for key in sorted(value, key=str):
            h.update(f"{key!s}:".encode())
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[%d" % len(value))
        for item in value:
            _feed(h, item)
        h.update(b"]")
    elif torch.is_tensor(value):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().tobytes())
    else:
        h.update(f"{type(value).__name__}={value!r};".encode())


def verify(payload: dict, path) -> None:
    """Refuse a payload whose recorded checksum differs from its contents', or that has none
    though its format version says every file of it has one (a checksum deleted to turn the
    check off)."""
    recorded = payload.get("checksum")
    if recorded is None:
        version = payload.get("version", 0)
        if isinstance(version, int) and version >= 3:  # files.CHECKSUMMED
            raise ValueError(
                f"{path} has no checksum, which every file of format {version} carries: the "
                "entry was removed, so the file was changed; use another copy, or write it again"
            )
        return
    rest = {k: v for k, v in payload.items() if k != "checksum"}
    if digest(rest) != recorded:
        raise ValueError(
            f"{path} is damaged: its contents do not match the checksum written with them (bytes "
            "changed on disk or in transfer); use another copy, or write it again"
        )


def check_tensors(tensors, path, entry: str, floating: bool = True) -> None:
    """Refuse an entry ``{name: tensor}`` that holds a non-tensor, an integer tensor where
    ``floating``, or NaN or infinite values."""
    if not isinstance(tensors, dict):
        raise ValueError(f"{path}: the {entry} entry is not a dict of tensors")
    for name, value in tensors.items():
        if not torch.is_tensor(value):
            raise ValueError(f"{path}: {entry}[{name!r}] is a {type(value).__name__}, not a tensor")
        if floating and not value.is_floating_point():
            raise ValueError(
                f"{path}: {entry}[{name!r}] is {value.dtype}, where a fit writes floating point; "
                "the file was changed"
            )
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise ValueError(
                f"{path}: {entry}[{name!r}] holds NaN or infinite values (a diverged fit, or a "
                "changed file): it cannot be used; load an earlier checkpoint or fit again"
            )


def check_entry_types(payload: dict, path, entry: str = "file") -> None:
    """Refuse the common entries of a result file (and of each ensemble member's) that are
    not of the type every writer gives them: ``options`` and ``info`` dicts, ``wall_time`` a
    non-negative finite number (also in ``history``), ``model`` a dict whose ``spec`` is a dict
    or ``None`` and whose ``state`` is a dict; a Python error naming no file otherwise."""
    for key in ("options", "info"):
        if key in payload and not isinstance(payload[key], dict):
            _wrong(path, entry, key, payload[key], "a mapping")
    for holder, where in ((payload, ""), (payload.get("history"), "history.")):
        if isinstance(holder, dict) and "wall_time" in holder:
            value = holder["wall_time"]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value >= 0):
                _wrong(path, entry, f"{where}wall_time", value, "a non-negative number of seconds")
    model = payload.get("model")
    if "model" in payload:
        if not isinstance(model, dict):
            _wrong(path, entry, "model", model, "a mapping (spec, state)")
        elif model.get("spec") is not None and not isinstance(model.get("spec"), dict):
            _wrong(path, entry, "model.spec", model["spec"], "a mapping or None")
        elif "state" in model and not isinstance(model["state"], dict):
            _wrong(path, entry, "model.state", model["state"], "a mapping of tensors")
    members = payload.get("members")
    if isinstance(members, list):
        for k, member in enumerate(members):
            if not isinstance(member, dict):
                _wrong(path, entry, f"members[{k}]", member, "a mapping")
            check_entry_types(member, path, f"member {k}")


def _wrong(path, entry: str, key: str, value, want: str) -> None:
    shown = f"{value!r}" if isinstance(value, (int, float)) else f"a {type(value).__name__}"
    raise ValueError(
        f"{path}: the {entry}'s {key} entry is {shown}, not {want} as every writer puts it: "
        "the file was changed; use another copy, or write it again"
    )


#: Running statistics that are never negative: a variance and a count.
NON_NEGATIVE = ("running_var", "num_batches_tracked")


def check_statistics(tensors: dict, path, entry: str) -> None:
    """Refuse running statistics no fit writes: a negative ``running_var`` (a variance) or
    ``num_batches_tracked`` (a count), besides what :func:`check_tensors` refuses."""
    check_tensors(tensors, path, entry, floating=False)
    for name, value in tensors.items():
        if name.rpartition(".")[2] in NON_NEGATIVE and bool((value < 0).any()):
            raise ValueError(
                f"{path}: {entry}[{name!r}] holds negative values, which a running variance or "
                "a count of batches never has: the file was changed; use another copy"
            )


def count_elements(shape, path, what: str) -> int:
    """The elements of a declared ``shape`` (``what`` in the file at ``path``), refused unless
    a list of sizes declaring at most :data:`MAX_ELEMENTS`."""
    if not isinstance(shape, (list, tuple)) or not all(is_int(s) and s >= 0 for s in shape):
        raise ValueError(f"{path}: {what} has shape {shape!r}, not a list of sizes")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"{path}: {what} declares {count:.3g} elements (shape {list(shape)}), past the "
            f"{MAX_ELEMENTS:.3g} a file may declare; the file is damaged or not a fit"
        )
    return count


def check_state(expected: dict, saved: dict, what: str) -> None:
    """Refuse a saved state dict whose entries, shapes or dtypes differ from ``expected``
    (the state of the object rebuilt to receive it), naming each difference."""
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    for key, value in saved.items():
        if not torch.is_tensor(value):
            raise ValueError(
                f"the saved state of {what}: [{key!r}] is a {type(value).__name__}, not a "
                "tensor. The file was changed; use another copy"
            )
    differ = [
        f"{k}: {tuple(saved[k].shape)} {saved[k].dtype} saved, {tuple(v.shape)} {v.dtype} rebuilt"
        for k, v in expected.items()
        if k in saved and (saved[k].shape != v.shape or saved[k].dtype != v.dtype)
    ]
    parts = (
        f"entries missing from the file {missing}" if missing else "",
        f"entries {what} does not have {extra}" if extra else "",
        f"shapes or dtypes differ ({'; '.join(differ)})" if differ else "",
    )
    if any(parts):
        raise ValueError(
            f"the saved state of {what} does not fit it: "
            + "; ".join(p for p in parts if p)
            + ". The file was changed, or written by another version of its family"
        )
