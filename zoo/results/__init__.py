"""What the library's fits, samplers and baselines return: every approximation is a
:class:`~zoo.results.posterior.Posterior` (one interface: predict, evaluate, sample,
to_arviz, save) and one :func:`~zoo.results.loading.load` reads any of them back.

The kinds: :class:`~zoo.results.variational.FitResult` (a variational fit),
:class:`~zoo.results.hmc.Reference` (HMC chains), :class:`~zoo.results.ensembles.Ensemble`,
:class:`~zoo.results.laplace_approximation.LaplaceFit` (with laplace-torch's bridge,
:mod:`~zoo.results.laplace_torch`) and :class:`~zoo.results.draws.Draws`
(:func:`~zoo.results.draws.from_draws`: draws made anywhere). The code that produces them
(``zoo.fit``, ``zoo.reference``, ``zoo.ensemble``, ``zoo.laplace``) sits above this package and
imports it; nothing here imports a producer."""
