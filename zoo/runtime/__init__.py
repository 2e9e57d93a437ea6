"""What every part of the library runs on: seeding (:mod:`~zoo.runtime.rng`), one call at a time
(:mod:`~zoo.runtime.serial`), child processes that end with their parent
(:mod:`~zoo.runtime.children`), CPU threads (:mod:`~zoo.runtime.threads`) and the processes of
a distributed run (:mod:`~zoo.runtime.distributed`). It imports no other package of the zoo but
the argument checks (:mod:`zoo.arguments`)."""
