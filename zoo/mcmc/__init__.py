"""Reference posteriors by Markov chain Monte Carlo: ``zoo.reference`` (:mod:`~zoo.mcmc.sampling`),
one chain run in chunks (:mod:`~zoo.mcmc.chain`) and what it returns (:mod:`~zoo.mcmc.result`)."""
