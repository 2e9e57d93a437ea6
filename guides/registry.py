"""Names of the posterior families. A new family is one module in ``guides/`` and one line here."""

from __future__ import annotations

import importlib

_FAMILIES = {
    "diagonal": "guides.diagonal:AutoDiagonal",
    "lowrank": "guides.lowrank:AutoLowRank",
    "tridiagonal": "guides.tridiagonal:AutoTridiagonal",
    "matrix_normal": "guides.matrix_normal:AutoMatrixNormal",
}


def available() -> list[str]:
    """Names accepted by :func:`get` (and by ``zoo.fit(model, "<name>", data)``)."""
    return sorted(_FAMILIES)


def get(name: str) -> type:
    """The guide class registered under ``name``, e.g. ``get("tridiagonal")``."""
    if not isinstance(name, str) or name not in _FAMILIES:
        raise ValueError(f"Unknown guide family {name!r}; known families are {available()}")
    module, attr = _FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attr)
