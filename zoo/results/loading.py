"""``zoo.load``: every kind of result file the library writes, read without unpickling code,
through the readers of the registered kinds by the file's ``kind`` (:data:`READERS`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

import zoo.results
from zoo.results.contract import Readers
from zoo.results.posterior import Posterior
from zoo.runtime.modules import import_all
from zoo.runtime.serial import one_at_a_time
from zoo.storage import files

#: Every module of :mod:`zoo.results`, imported so that the class statements of the kinds in
#: them register them: a new kind is one file there (a kind defined elsewhere registers when its
#: module is imported, as ``zoo``'s baselines are by ``import zoo``).
KIND_MODULES = import_all(zoo.results)

#: The reader of each ``kind`` a file may declare, ``(payload, path, model, map_location) ->
#: Posterior`` (each checks the payload before anything is built from it): derived, live, from
#: the kinds registered by their class statements (:data:`zoo.results.contract.KINDS`). A new
#: kind of posterior is one class, ``class X(zoo.Posterior, kind="x")`` with its ``read``.
READERS = Readers()


@one_at_a_time
def load(
    path: str | os.PathLike,
    model: Callable | None = None,
    map_location: str | torch.device = "cpu",
    allow_pickle: bool = False,
) -> Posterior:
    """Load any posterior :meth:`zoo.Posterior.save` wrote, returned as the kind that was
    saved (:class:`zoo.FitResult`, :class:`zoo.Reference`, :class:`zoo.Ensemble`,
    :class:`zoo.LaplaceFit` with laplace-torch installed, or the draws of
    :func:`zoo.from_draws`), on ``map_location`` (CPU by default).

    Parameters
    ----------
    path : path
        The file.
    model : callable, optional
        Attach the posterior to this model instead of rebuilding the saved one (needed when the
        model is not a ``zoo.models`` class); its sample sites must have the names and shapes
        the posterior was made for, else a ``ValueError`` says which differ. An ensemble's
        members each get a copy of it.
    map_location : str or torch.device
        Where the model and posterior go; a fit saved on CUDA loads on the CPU by default.
    allow_pickle : bool, default False
        Also open fit files written before version 2, which are pickled Python objects:
        unpickling runs code from the file, so pass ``True`` only for files you trust (then
        ``save`` again to rewrite them as plain data).

    Notes
    -----
    Every file is checked before anything is built from it: a damaged or changed file is
    refused with a ``ValueError`` naming it.
    """
    payload = files.read(path, tuple(READERS), map_location="cpu", allow_pickle=allow_pickle)
    return READERS[payload["kind"]](payload, path, model, map_location)
