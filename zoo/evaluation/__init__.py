"""Posterior predictives of a fitted model (:mod:`~zoo.evaluation.predictive`) and how close one
is to a reference (:mod:`~zoo.evaluation.agreement`). Metrics, figures and ArviZ are the public
modules :mod:`zoo.metrics`, :mod:`zoo.plots` and :mod:`zoo.arviz`."""
