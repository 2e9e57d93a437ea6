"""Files: atomic writes, plain-data payloads read without unpickling code, and the guide and
model they rebuild.

Every file is written atomically: to a temporary file in the same folder, flushed to disk, then
renamed over the target, so a reader (or a fit killed mid-write) never sees half a file.

A file holds plain data only (tensors, numbers, strings, lists, dicts), read back with
``torch.load(weights_only=True)``: opening it runs no code from it. A guide is saved as its spec
(family name and options, :meth:`guides.PerSiteGuide.spec`), the example input's shape, the site
names and shapes, and its state dict; it is rebuilt through the family registry and its
parameters loaded. A model of ``zoo.models`` is saved as its spec (class, arguments, prior,
likelihood) and its buffers; a network of the user's is passed again as ``model=``.

Fit files of version 1 were pickled objects. :func:`read` opens them only with
``allow_pickle=True``, which runs code from the file: use it for files you trust, then save
again to rewrite them in this format. A pickled file that does not declare itself such a fit
(its header read from the pickle's opcodes, :mod:`zoo.storage.declared`) is refused under any
flag, before anything is unpickled.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.runtime.children import orphaned
from zoo.storage import checks as file_checks
from zoo.storage.declared import declared
from zoo.storage.sizes import check_declared, compact

FORMAT = "bnn-zoo"
#: The format's version: 1, pickled objects; 2, plain data (a checksum from some release of
#: 0.3.0 on); 3, plain data whose checksum (and a checkpoint's identity) every file carries, so
#: a file of version 3 without them was changed and is refused; 4, a checkpoint's identity
#: records the model too.
VERSION = 4
#: The first version of each kind that appeared after version 1: an earlier one declared by
#: such a file is a changed file (no checksum would be checked).
FIRST_VERSION = {"draws": 3}
#: The first version whose files must carry a checksum.
CHECKSUMMED = 3


def atomic_save(obj, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = compact(obj)  # no expanded views: a reader refuses them (zoo.storage.sizes)
    if isinstance(obj, dict) and obj.get("format") == FORMAT:  # a payload read back has one
        body = {key: value for key, value in obj.items() if key != "checksum"}
        obj = {**body, "checksum": file_checks.digest(body)}
    remove_stale_temporaries(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent
    )
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp, _file_mode(path))
        with os.fdopen(fd, "wb") as f:
            _lock(f.fileno())  # held while written: another run sees it is not orphaned
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


#: A temporary file of an interrupted save older than this (seconds) is removed by the next
#: save to the same path; a younger one may be another process's save in progress.
STALE_AFTER = 3600.0


def _lock(fd: int) -> None:
    """An exclusive ``flock`` on the open file ``fd`` (released when it is closed)."""
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass


def remove_stale_temporaries(path: Path) -> None:
    """Remove what a killed save to ``path`` left: ``.<name>.<pid>.*.tmp`` files whose lock no
    writer holds (:func:`zoo.runtime.children.orphaned`: a writer holds its file's lock while
    it writes, whatever PID namespace it runs in), and any older than :data:`STALE_AFTER`
    seconds (a writer on another machine sharing the folder, where locks may not reach)."""

    now, head = time.time(), f".{path.name}."
    for tmp in path.parent.glob(f"{head}*.tmp"):
        writer = tmp.name[len(head) :].split(".", 1)[0]
        try:
            made = tmp.stat().st_mtime
            if now - made > STALE_AFTER or orphaned(tmp, writer, made):
                tmp.unlink()
        except OSError:
            pass


def _file_type(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "no regular file"


def read(
    path: str | os.PathLike, kind: str | tuple[str, ...], map_location=None, allow_pickle=False
):
    """The payload dict of a ``kind`` file (``"fit"``, ``"checkpoint"``, ``"reference"``,
    ``"hmc-chain"``, or a tuple of those it may be).

    Files of this version are read with ``weights_only=True``. A version-1 file (pickled
    objects) needs ``allow_pickle=True``, which unpickles it and so runs code from the file.
    """
    path = Path(path)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    label = kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} or {kinds[-1]}"
    if not path.exists():
        raise FileNotFoundError(f"no {label} file at {path}")
    if not path.is_file():  # a FIFO would block the first read for ever; a device never end
        raise ValueError(
            f"{path} is not a regular file (it is {_file_type(path)}): a {label} file is one "
            "that fit.save or a checkpoint wrote; give the path of such a file"
        )
    check_declared(path)  # every tensor's sizes, before anything is allocated
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "global" not in str(err).lower():  # not objects: bytes no writer produces
            raise ValueError(_damaged(path, label, err)) from None
        header = declared(path)  # read from the opcodes: nothing is unpickled
        if not _old_fit(header) or "fit" not in kinds:
            raise ValueError(
                f"{path} holds pickled Python objects and is no fit file of bnn-zoo's format 1 "
                f"(it declares {_described(header)}), the only kind the library ever pickled; "
                "unpickling it would run code from it, so it is refused under any flag"
            ) from None
        if not allow_pickle:
            raise ValueError(
                f"{path} holds pickled Python objects: a fit file of bnn-zoo's format 1 (before "
                f"version 0.3.0). Opening it runs code from the file: if you trust it, pass "
                "allow_pickle=True, then save it again to rewrite it as plain data"
            ) from None
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # truncated, bit-flipped or empty: whatever the reader hits
        raise ValueError(_damaged(path, label, err)) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a bnn-zoo {label} file")
    if payload.get("kind") not in kinds:
        raise ValueError(f"{path} is a bnn-zoo {payload.get('kind')} file, not a {label} file")
    version = payload.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"{path}: its format version {version!r} is not a whole number")
    if version > VERSION:
        raise ValueError(f"{path} was written by a newer bnn-zoo (format {payload['version']})")
    first = FIRST_VERSION.get(payload["kind"], 0)
    if version < first:
        raise ValueError(
            f"{path} declares format {version}, but {payload['kind']} files were first written "
            f"in format {first}: the file was changed; use another copy, or write it again"
        )
    file_checks.verify(payload, path)
    if version >= 2:  # plain data: pickled files of format 1 hold objects
        file_checks.check_entry_types(payload, path)
    return payload


def _old_fit(header: dict) -> bool:
    """Whether a pickled file's header (:func:`zoo.storage.declared.declared`) is that of a
    fit file of format 1, the only files the library wrote as pickled objects."""
    return (
        header.get("format") == FORMAT
        and header.get("kind") == "fit"
        and (header.get("version") == 1)
    )


def _described(header: dict) -> str:
    if header.get("format") != FORMAT:
        return "no bnn-zoo header" if not header else f"the format {header.get('format')!r}"
    return f"a {header.get('kind')!r} file of format {header.get('version')!r}"


def _damaged(path, label: str, err: Exception) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else "empty or truncated"
    if isinstance(err, pickle.UnpicklingError):
        first = "its bytes do not parse as saved data"
    return (
        f"{path} is damaged and cannot be read as a {label} file ({type(err).__name__}: "
        f"{first}); it may have been cut short or changed on disk: use another copy, or write "
        "it again"
    )


def require(payload: dict, keys, path, entry: str = "file") -> None:
    """Refuse a payload that lacks any of ``keys``, naming the file and what is missing."""
    missing = [key for key in keys if key not in payload]
    if missing:
        raise ValueError(
            f"{path}: the {entry} has no {', '.join(repr(k) for k in missing)} "
            f"entr{'y' if len(missing) == 1 else 'ies'}; it was cut short or changed: use another "
            "copy, or write it again"
        )


def plain_data(value):
    """``value`` with anything that is not plain data (a callable, say) as its ``repr``."""
    if isinstance(value, dict):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.device):
        return str(value)
    return repr(value)


# ---- random number generators as plain data -------------------------------------------------
def rng_state(generator: torch.Generator) -> dict:
    """The states of torch's, Python's and NumPy's global generators and of ``generator``."""
    numpy_state = np.random.get_state()  # noqa: NPY002
    assert isinstance(numpy_state, tuple)  # legacy=True: the tuple form
    kind, keys, pos, has_gauss, cached = numpy_state
    version, internal, gauss_next = random.getstate()
    return {
        **torch_rng_state(),
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "generator": generator.get_state(),
    }


def torch_rng_state() -> dict:
    """torch's global generators: ``"torch"`` (CPU) and, where CUDA is, ``"cuda"`` (all)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict) -> None:
    """Restore what :func:`torch_rng_state` recorded (CUDA's only where CUDA is)."""
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    """Restore what :func:`rng_state` recorded."""
    set_torch_rng_state(state)
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss_next))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.cpu().numpy().astype(np.uint32)
    np.random.set_state((kind, keys, pos, has_gauss, cached))  # noqa: NPY002
    generator.set_state(state["generator"].cpu())


def device_of(model) -> torch.device | None:
    """The device of a module's first parameter or buffer; None for anything else."""
    if isinstance(model, torch.nn.Module):
        for t in list(model.parameters()) + list(model.buffers()):
            return t.device
    return None


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, else ``0o666`` less the process umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where the system shows it (Linux's
    ``/proc``): setting it to read it back would, for an instant, give files that another
    thread creates the wrong mode."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
