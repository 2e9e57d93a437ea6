"""What every part of the library runs on: seeding (:mod:`~zoo.runtime.rng`), one call at a time
(:mod:`~zoo.runtime.serial`), child processes (:mod:`~zoo.runtime.children`), CPU threads
(:mod:`~zoo.runtime.threads`), the processes of a distributed run
(:mod:`~zoo.runtime.distributed`), files (:mod:`~zoo.runtime.files`,
:mod:`~zoo.runtime.file_checks`) and the checks of plain arguments
(:mod:`~zoo.runtime.arguments`). It imports no other package of the zoo."""
