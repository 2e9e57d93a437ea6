"""What a file's tensors declare, checked before ``torch.load`` allocates any of them.

``torch.load`` allocates each storage at the size its pickle declares, then views it at the
declared sizes and strides: a 7 KB file can declare a storage of 2**40 floats (the allocator
aborts the process) or a view ``torch.zeros(1).expand(2**40)`` whose first copy asks for 4 TB.
:func:`check_declared` reads the pickle of a torch zip archive with an unpickler that builds
nothing (every global it names becomes an inert stand-in, every storage a record of its
declaration) and refuses, naming the entry, any tensor that:

- declares more than :data:`~zoo.storage.checks.MAX_ELEMENTS` elements;
- views more elements than its storage holds (a stride-0 or overlapping view: no writer of the
  library produces one, :func:`compact` sees to that), or reaches past its storage's end;
- has a storage whose declared bytes differ from the bytes its record holds in the archive;
- is of a form no bnn-zoo file holds (sparse, quantised, meta, nested or subclass tensors).

An archive entry that is compressed (torch writes them stored) is refused too, before it is
read: its declared size, not the file's, would be what a reader allocates.
"""

from __future__ import annotations

import copy
import io
import math
import os
import pickle
import zipfile

import torch

from zoo.storage.checks import MAX_ELEMENTS

__all__ = ["check_declared", "compact"]

#: The tensor rebuilders this module reads; the other ones torch's loader accepts build tensors
#: of forms no bnn-zoo file holds and are refused.
_TENSOR = "torch._utils._rebuild_tensor_v2"
_PARAMETERS = ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state")


class _Stub:
    """An inert stand-in for any object a pickle builds."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Dict(dict):
    """A dict that takes a pickled instance state (a state dict's ``_metadata``)."""


class _Storage:
    """A storage as its pickle declares it."""

    def __init__(self, kind, key, numel):
        self.kind, self.key, self.numel = kind, key, numel


class _Tensor:
    """A tensor as its pickle declares it: storage, offset, sizes and strides."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class _Refused(Exception):
    pass


class _Reader(pickle.Unpickler):
    def find_class(self, module, name):
        full = f"{module}.{name}"
        if full == _TENSOR:
            return lambda storage, offset, size, stride, *rest: _Tensor(
                storage, offset, size, stride
            )
        if full in _PARAMETERS:
            return lambda data, *rest: data
        if full.startswith(("torch._utils._rebuild", "torch._tensor._rebuild")):
            raise _Refused(f"a tensor built by {full}")
        if module in ("torch", "torch.cuda", "torch.storage") and name.endswith("Storage"):
            return ("storage", name)
        if full == "collections.OrderedDict":
            return _Dict
        return type(name, (_Stub,), {})

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused(f"a persistent record {type(pid).__name__} no torch writer produces")
        _, kind, key, _location, numel = pid
        return _Storage(kind, key, numel)


#: Bytes per element of each storage type torch names in a file (``torch.FloatStorage``, ...).
_ITEMSIZE = {
    "UntypedStorage": 1,
    **{
        f"{name}Storage": dtype.itemsize
        for name, dtype in (
            ("Float", torch.float32), ("Double", torch.float64), ("Half", torch.float16),
            ("BFloat16", torch.bfloat16), ("Long", torch.int64), ("Int", torch.int32),
            ("Short", torch.int16), ("Char", torch.int8), ("Byte", torch.uint8),
            ("Bool", torch.bool), ("ComplexFloat", torch.complex64),
            ("ComplexDouble", torch.complex128),
        )
    },
}  # fmt: skip


def _itemsize(kind) -> int | None:
    name = kind[1] if isinstance(kind, tuple) and len(kind) == 2 else None
    return _ITEMSIZE.get(name) if isinstance(name, str) else None


def check_declared(path: str | os.PathLike) -> None:
    """Refuse the torch zip archive at ``path`` if a tensor it holds declares a size past the
    bounds above (a ``ValueError`` naming the entry); return quietly for files that are no
    torch zip archive, for ``torch.load`` to refuse as it does."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError):
        return
    with archive:
        infos = archive.infolist()
        packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
        if packed:
            raise ValueError(
                f"{path}: its entry {packed[0]!r} is compressed, which no torch writer does: the "
                "file was changed or is not a bnn-zoo file; use another copy, or write it again"
            )
        pickles = [i for i in infos if i.filename.endswith("/data.pkl")]
        if len(pickles) != 1:
            return
        root = pickles[0].filename[: -len("data.pkl")]
        records = {i.filename[len(root) + 5 :]: i.file_size for i in infos
                   if i.filename.startswith(root + "data/")}  # fmt: skip
        try:
            tree = _Reader(io.BytesIO(archive.read(pickles[0]))).load()
        except _Refused as why:
            raise ValueError(f"{path} holds {why}, which no bnn-zoo file holds") from None
        except Exception:  # bytes that do not parse: torch.load's own error says so
            return
    for where, tensor in _tensors(tree, "file", set()):
        problem = _problem(tensor, records)
        if problem:
            raise ValueError(
                f"{path}: {where} {problem}; the file is damaged or was changed, and is refused "
                "before anything is allocated: use another copy, or write it again"
            )


def _tensors(value, where: str, seen: set, depth: int = 0):
    """``(where, _Tensor)`` for each tensor in a stand-in tree, ``where`` its key path. Each
    object is visited once (``seen``: a pickle's memo can share one list at every level of a
    deep nest, which a walk of every path would take exponential time over)."""
    if depth > 64 or id(value) in seen:
        return
    if isinstance(value, _Tensor):
        seen.add(id(value))
        yield where, value
    elif isinstance(value, dict):
        seen.add(id(value))
        for key, item in value.items():
            yield from _tensors(item, f"{where}[{key!r}]", seen, depth + 1)
    elif isinstance(value, (list, tuple)):
        seen.add(id(value))
        for k, item in enumerate(value):
            yield from _tensors(item, f"{where}[{k}]", seen, depth + 1)


def _sizes(values) -> bool:
    return isinstance(values, tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    )


def _problem(tensor: _Tensor, records: dict) -> str | None:
    """What is wrong with one declared tensor, or ``None``."""
    storage, offset, size, stride = tensor.storage, tensor.offset, tensor.size, tensor.stride
    if not isinstance(storage, _Storage) or not _sizes(tuple(size) if isinstance(size, list)
                                                       else size):  # fmt: skip
        return "is a tensor whose declaration does not parse"
    size = tuple(size)
    stride = tuple(stride) if isinstance(stride, (list, tuple)) else stride
    if not (_sizes(stride) and len(stride) == len(size) and _sizes((offset,))):
        return f"declares strides {stride!r} and offset {offset!r} that no tensor has"
    numel = math.prod(size)
    if numel > MAX_ELEMENTS:
        return f"declares {numel:.3g} elements (shape {list(size)}), past the {MAX_ELEMENTS:.3g}"
    itemsize, held = _itemsize(storage.kind), records.get(str(storage.key))
    if itemsize is None or not _sizes((storage.numel,)) or held is None:
        return f"names a storage ({storage.kind!r}, record {storage.key!r}) the file lacks"
    if storage.numel * itemsize != held:
        return (
            f"declares a storage of {storage.numel * itemsize:,} bytes whose record holds {held:,}"
        )
    if numel == 0:
        return None
    end = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1
    if end > storage.numel or numel > storage.numel:
        return (
            f"views {numel:,} elements (shape {list(size)}, strides {list(stride)}) of a storage "
            f"of {storage.numel:,}: an expanded or overlapping view, which no writer produces"
        )
    return None


def compact(value):
    """``value`` (nested dicts, lists, tuples) with every tensor that views more elements than
    its storage holds (``expand``, overlapping strides) replaced by a copy, so that the file
    written passes :func:`check_declared`. A container is copied (with its attributes, such as
    a state dict's ``_metadata``) only where something in it was replaced."""
    if torch.is_tensor(value):
        holds = value.untyped_storage().nbytes() // max(value.element_size(), 1)
        if value.numel() > holds:
            return value.clone(memory_format=torch.contiguous_format)
        return value
    if isinstance(value, dict):
        changed = {k: new for k, item in value.items() if (new := compact(item)) is not item}
        if not changed:
            return value
        out = copy.copy(value)
        out.update(changed)
        return out
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        items = [compact(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return type(value)(items)
    return value
