"""``zoo.load``: every kind of result file this library writes, read without unpickling code."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from zoo.runtime import files
from zoo.runtime.serial import one_at_a_time
from zoo.training.result import from_payload


@one_at_a_time
def load(
    path: str | os.PathLike,
    model: Callable | None = None,
    map_location: str | torch.device = "cpu",
    allow_pickle: bool = False,
):
    """Load a fit (:meth:`zoo.FitResult.save`), an HMC reference
    (:meth:`zoo.Reference.save`), an ensemble (:meth:`zoo.Ensemble.save`) or a Laplace
    approximation (:meth:`zoo.LaplaceFit.save`, laplace-torch installed), returned as what was
    saved, on ``map_location`` (CPU by default).

    Parameters
    ----------
    path : path
        The file.
    model : callable, optional
        Attach the guide to this model instead of rebuilding the saved one (needed when the
        model is not a ``zoo.models`` class); its sample sites must have the names and shapes
        the guide was fitted to, else a ``ValueError`` says which differ. An ensemble's members
        each get a copy of it.
    map_location : str or torch.device
        Where the model and guide go; a fit saved on CUDA loads on the CPU by default.
    allow_pickle : bool, default False
        Also open fit files written before version 2, which are pickled Python objects:
        unpickling runs code from the file, so pass ``True`` only for files you trust (then
        ``save`` again to rewrite them as plain data).

    Every file is checked before anything is built from it: a damaged or changed file is
    refused with a ``ValueError`` naming it.
    """
    kinds = ("fit", "reference", "ensemble", "laplace")
    payload = files.read(path, kinds, map_location="cpu", allow_pickle=allow_pickle)
    if payload.get("kind") == "ensemble":
        from zoo.baselines.ensembles import ensemble_from_payload

        return ensemble_from_payload(payload, path, model, map_location)
    if payload.get("kind") == "laplace":
        from zoo.baselines.laplace_fit import laplace_from_payload

        return laplace_from_payload(payload, path, model, map_location)
    return from_payload(payload, path, model, map_location)
