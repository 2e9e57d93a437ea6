"""Benchmark results written atomically: a run killed while it saves leaves the file it had."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json(obj, path: str | os.PathLike, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically: serialised in memory first (an object JSON
    cannot hold raises before the file is touched), then written to a temporary file in the
    same folder, flushed to disk and renamed over ``path``, so a reader never sees half a file
    and a kill mid-write keeps the previous file."""
    path = Path(path)
    text = json.dumps(obj, indent=indent) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
