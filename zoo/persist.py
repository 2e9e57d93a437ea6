"""Saving fitted guides, checkpoints and resuming.

Files are written atomically: to a temporary file in the same folder, flushed to disk, then
renamed over the target, so a reader (or a fit killed mid-write) never sees half a file.

A saved fit holds the model (pickled: its class must be importable when loading) and the guide
(its class, parameters and prototype trace). ``zoo.load(path)`` restores both on the CPU unless
told otherwise; ``zoo.load(path, model=...)`` attaches the guide to a model you built yourself,
after checking that its sample sites have the same names and shapes.
"""

from __future__ import annotations

import io
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

FORMAT = "bnn-zoo"
VERSION = 1


def atomic_save(obj, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp, _file_mode(path))
        with os.fdopen(fd, "wb") as f:
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


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, else ``0o666`` less the process umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


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


def read(path: str | os.PathLike, kind: str, map_location=None) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {kind} file at {path}")
    payload = torch.load(path, map_location=map_location, weights_only=False)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a bnn-zoo {kind} file")
    if payload.get("kind") != kind:
        raise ValueError(f"{path} is a bnn-zoo {payload.get('kind')} file, not a {kind} file")
    if payload.get("version", 0) > VERSION:
        raise ValueError(f"{path} was written by a newer bnn-zoo (format {payload['version']})")
    return payload


def site_signature(guide) -> dict[str, tuple[int, ...]]:
    return {
        name: tuple(guide.prototype_trace.nodes[name]["value"].shape) for name in guide.site_names
    }


def model_signature(model, guide) -> dict[str, tuple[int, ...]]:
    """Shapes of the model's latent sites, traced with the guide's own example input."""
    from pyro import poutine
    from pyro.poutine.util import site_is_subsample

    args = guide.prototype_trace.nodes["_INPUT"]["args"]
    kwargs = guide.prototype_trace.nodes["_INPUT"]["kwargs"]
    device = _device_of(model)
    if device is not None:
        args = tuple(a.to(device) if torch.is_tensor(a) else a for a in args)
    with torch.no_grad():
        trace = poutine.block(poutine.trace(model).get_trace)(*args, **kwargs)
    return {
        name: tuple(site["value"].shape)
        for name, site in trace.iter_stochastic_nodes()
        if not site_is_subsample(site) and not site["is_observed"]
    }


def attach(guide, model) -> None:
    """Attach a loaded guide to ``model``, checking that the two have the same sites."""
    expected = site_signature(guide)
    found = model_signature(model, guide)
    if expected != found:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        shapes = sorted(
            f"{n}: {expected[n]} vs {found[n]}"
            for n in set(expected) & set(found)
            if expected[n] != found[n]
        )
        raise ValueError(
            "the saved guide was fitted to a different model: "
            + "; ".join(
                part
                for part in (
                    f"sites missing from this model {missing}" if missing else "",
                    f"sites the guide does not know {extra}" if extra else "",
                    f"shapes differ ({', '.join(shapes)})" if shapes else "",
                )
                if part
            )
        )
    guide._model = (model,)


def rng_state(generator: torch.Generator) -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (pyro.set_rng_seed seeds it)
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    generator.set_state(state["generator"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _device_of(model):
    if isinstance(model, torch.nn.Module):
        for t in list(model.parameters()) + list(model.buffers()):
            return t.device
    return None
