"""Everything that reads a posterior's predictions: the posterior predictive in blocks of draws
and inputs (:mod:`~zoo.evaluation.predictive`), distances to a reference
(:mod:`~zoo.evaluation.agreement`), figures (:mod:`~zoo.evaluation.plots`, public as
``zoo.plots``) and every ArviZ call (:mod:`~zoo.evaluation.arviz`, public as ``zoo.arviz``).
The metrics' formulas are :mod:`zoo.metrics`, below the models, whose likelihoods use them."""
