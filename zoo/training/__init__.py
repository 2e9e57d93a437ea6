"""A fit: ``zoo.fit`` (:mod:`~zoo.training.fitting`), its option groups
(:mod:`~zoo.training.options`), the loop (:mod:`~zoo.training.loop`), the stepper
(:mod:`~zoo.training.step`) and its rules (:mod:`~zoo.training.rules`), the CUDA-graph step,
divergence, optimisers, convergence, default lengths (:mod:`~zoo.training.recipes`),
checkpoints and what a resume must match (:mod:`~zoo.training.checkpoint`). What a fit
returns, :class:`zoo.FitResult`, lives in :mod:`zoo.results`."""
