"""The objective a fit minimises: the scaled ``-ELBO`` of a model and a guide
(:mod:`~zoo.inference.objective`), how it is scaled (:mod:`~zoo.inference.elbo`), the gradient
estimators (:mod:`~zoo.inference.estimators`), the reduced ELBO (:mod:`~zoo.inference.surrogate`)
and how the loss is evaluated (:mod:`~zoo.inference.compiled`)."""
