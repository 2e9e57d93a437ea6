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

No call waits on a call that waits on it. While a fit runs a user's callback
(:func:`user_code`) it lends the lock out: a call from another thread that the callback starts
(and perhaps joins) runs then, exactly as alone (its seeded generators are forked from, and
given back to, the paused fit's), and the fit takes the lock back when the callback returns,
after that call has finished. A forked child (an ensemble's member, an HMC chain) starts with a
lock of its own, free, whatever thread held the parent's at the fork
(``os.register_at_fork``).

Code that drives Pyro itself (a user's loop on :class:`zoo.Stepper`, ``pyro.infer.SVI``) in
other threads at the same time is outside the lock and is not protected; nor is a seeded fit's
exactness against another thread that draws from torch's global generator while it runs
(building a model initialises its layers from it): Pyro draws from that one generator, so the
fit's draws change (it is still a correct fit). Build the models, then start the threads.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["one_at_a_time", "user_code"]

F = TypeVar("F", bound=Callable)


class _Lock:
    """The process-wide re-entrant lock, how deep each thread holds it, and the loans open now
    (a stack: each counts the outermost calls that began while it was the newest)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.depth: dict[int, int] = {}  # thread ident -> nested calls holding the lock
        self.loans: list[list[int]] = []  # [borrowers still running] per open loan
        self.changed = threading.Condition()


_STATE = _Lock()


def _fresh_lock_in_child() -> None:
    """A forked child has one thread, whatever held the parent's lock: a lock of its own."""
    global _STATE
    _STATE = _Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


def one_at_a_time(function: F) -> F:
    """``function`` run under the process-wide lock of this module."""

    @functools.wraps(function)
    def locked(*args, **kwargs):
        state, me = _STATE, threading.get_ident()
        with state.lock:
            loan = None
            if me not in state.depth:
                with state.changed:
                    if state.loans:  # a call that began while a callback lent the lock out
                        loan = state.loans[-1]
                        loan[0] += 1
            state.depth[me] = state.depth.get(me, 0) + 1
            try:
                return function(*args, **kwargs)
            finally:
                state.depth[me] -= 1
                if not state.depth[me]:
                    del state.depth[me]
                if loan is not None:
                    with state.changed:
                        loan[0] -= 1
                        state.changed.notify_all()

    return locked  # type: ignore[return-value]


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Run a user's code (a fit's callback) with the lock lent out: a library call another
    thread makes meanwhile runs, and this thread takes the lock back afterwards, once every
    call that began during the loan has ended. Without the lock held here, a plain block."""
    state, me = _STATE, threading.get_ident()
    depth = state.depth.pop(me, 0)
    if not depth:
        yield
        return
    loan = [0]
    with state.changed:
        state.loans.append(loan)
    for _ in range(depth):
        state.lock.release()
    try:
        yield
    finally:
        while True:  # the lock, with no call of this loan still running (or paused in its own)
            with state.changed:
                state.changed.wait_for(lambda: loan[0] == 0)
            state.lock.acquire()
            if loan[0] == 0:
                break
            state.lock.release()
        for _ in range(depth - 1):
            state.lock.acquire()
        with state.changed:
            state.loans[:] = [other for other in state.loans if other is not loan]
        state.depth[me] = depth
