"""The field's baselines beside the variational families, as producers of
:class:`zoo.Posterior` s: deep ensembles (:mod:`~zoo.baselines.ensembles`, members in processes:
:mod:`~zoo.baselines.ensemble_processes`) and the Laplace approximation through laplace-torch
(:mod:`~zoo.baselines.laplace_fitting`). What they return lives in :mod:`zoo.results`.

Each baseline registers its producer in its own module (:mod:`~zoo.baselines.producers`);
importing the package imports every module in it, so a new baseline is one file here."""

import sys as _sys

from zoo.runtime.modules import import_all as _import_all

_import_all(_sys.modules[__name__])
