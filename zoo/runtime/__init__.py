"""What every part of the library runs on: seeding (:mod:`~zoo.runtime.rng`), one call at a time
(:mod:`~zoo.runtime.serial`), child processes that end with their parent
(:mod:`~zoo.runtime.children`), CPU threads (:mod:`~zoo.runtime.threads`), the processes
of a distributed run (:mod:`~zoo.runtime.distributed`) and the packages it runs on, the torch
and torchvision pair checked (:mod:`~zoo.runtime.packages`). It imports no other package of the
zoo but the argument checks (:mod:`zoo.arguments`)."""
