"""Reference posteriors by Markov chain Monte Carlo: ``zoo.reference`` (:mod:`~zoo.mcmc.sampling`),
the samplers (:mod:`~zoo.mcmc.samplers`) and one chain run in chunks (:mod:`~zoo.mcmc.chain`).
What it returns, :class:`zoo.Reference`, lives in :mod:`zoo.results`."""
