"""The field's baselines beside the variational families, as producers of
:class:`zoo.Posterior` s: deep ensembles (:mod:`~zoo.baselines.ensembles`, members in processes:
:mod:`~zoo.baselines.ensemble_processes`) and the Laplace approximation through laplace-torch
(:mod:`~zoo.baselines.laplace_fitting`). What they return lives in :mod:`zoo.results`."""
