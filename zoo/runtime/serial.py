"""One library call at a time per process: ``fit``, ``predict``, ``evaluate``, ``to_arviz``,
``reference``, ``compare`` and ``load`` called from several threads run one after another.

Pyro keeps its effect handlers on one process-wide stack, and a fit seeds torch's global
generators (forked, so the caller's state is back afterwards): two fits interleaved in two
threads push their handlers onto each other's stack (Pyro's ``This Messenger is not on the
bottom of the stack``, ``Multiple sample sites named ...``) or draw from each other's seeded
generator and end, without an error, with other parameters than either fit alone. Pyro's
model and guide programs cannot run side by side in one process, so these calls take one
re-entrant lock: a call from a second thread waits until the first returns, then runs exactly
as it would alone (same seed, same result). A thread pool of fits, a notebook kernel or a web
service gets correct results; for parallel fits use processes (``zoo.Engine(devices=...)``, or
one process per fit). A call made inside another in the same thread (``compare``'s fits, a
callback that predicts) does not wait.

Code that drives Pyro itself (a user's loop on :class:`zoo.Stepper`, ``pyro.infer.SVI``) in
other threads at the same time is outside the lock and is not protected; nor is a seeded fit's
exactness against another thread that draws from torch's global generator while it runs
(building a model initialises its layers from it): Pyro draws from that one generator, so the
fit's draws change (it is still a correct fit). Build the models, then start the threads.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["one_at_a_time"]

_LOCK = threading.RLock()

F = TypeVar("F", bound=Callable)


def one_at_a_time(function: F) -> F:
    """``function`` run under the process-wide lock of this module."""

    @functools.wraps(function)
    def locked(*args, **kwargs):
        with _LOCK:
            return function(*args, **kwargs)

    return locked  # type: ignore[return-value]
