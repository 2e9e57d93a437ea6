"""Import every module of a package, so that what registers itself in its module (a posterior
kind by its class statement, a baseline's producer by its ``register`` call) is known as soon as
the package is: a new kind or baseline is then one file, with no list to keep."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["import_all"]


def import_all(package: ModuleType) -> tuple[ModuleType, ...]:
    """The modules of ``package`` (not its subpackages), each imported (an import already done
    is Python's cached module), in name order."""
    found = sorted(
        info.name
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
        if not info.ispkg
    )
    return tuple(importlib.import_module(name) for name in found)
