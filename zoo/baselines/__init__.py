"""The field's baselines beside the variational families: deep ensembles
(:mod:`zoo.baselines.ensembles`), and the loader that reads every kind of saved result
(:mod:`zoo.baselines.loading`)."""
