"""The posterior families, one module each: a family is one file here whose class statement
registers it (``class AutoX(PerSiteGuide, family="x")``, :mod:`guides.registry`). Importing
this package imports every module in it, so a new file is a new family with no list to keep.

Until version 0.4 the families were modules of ``guides`` itself (``guides.tridiagonal``);
:data:`MOVED` names them, and each old path is an alias of its module here, so code and
pickled files written then (``zoo.load(..., allow_pickle=True)``) still find their classes.
"""

import importlib as _importlib
import pkgutil as _pkgutil
import sys as _sys

#: The family modules that lived at ``guides.<name>`` before this package.
MOVED = (
    "block_diagonal",
    "diagonal",
    "joint",
    "lowrank",
    "matrix_normal",
    "mc_dropout",
    "mixed",
    "point_mass",
    "subnetwork",
    "tridiagonal",
    "whvi",
)


def import_all() -> list[str]:
    """Import every module of this package (a new family's file among them), in name order;
    returns their names. Run when the package is imported."""
    names = sorted(info.name for info in _pkgutil.iter_modules(__path__, __name__ + "."))
    for name in names:
        _importlib.import_module(name)
    return names


import_all()


def alias_old_paths(package) -> None:
    """Make ``<package>.<name>`` the module ``guides.families.<name>`` for every moved family
    (in ``sys.modules`` and as an attribute of ``package``, as an imported submodule is)."""
    for name in MOVED:
        module = _sys.modules[f"{__name__}.{name}"]
        _sys.modules.setdefault(f"{package.__name__}.{name}", module)
        setattr(package, name, module)
