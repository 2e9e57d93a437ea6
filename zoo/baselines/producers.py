"""What makes a posterior that is not a family's fit, keyed by the name a :func:`zoo.compare`
row or the command line gives it: a baseline registers itself here, in its own module, with
:func:`register` (as a posterior kind registers by its class statement,
``class X(zoo.Posterior, kind="x")``), so a new baseline is one file in ``zoo/baselines/``: the
package imports each of its modules (:func:`discover`), and ``compare``'s rows, the command
line's ``--guides`` and ``zoo.load`` then know it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PRODUCERS", "Producer", "register", "unregister"]


@dataclass(frozen=True)
class Producer:
    """What makes a kind of row: ``check(options)`` before any fit (raising ``ValueError`` or
    ``TypeError`` for options it cannot use), and ``make(model_factory, family, options,
    train, fit_args, progress) -> Posterior``."""

    check: Callable[[dict], None]
    make: Callable[..., Any]


#: The registered producers by name, in registration order.
PRODUCERS: dict[str, Producer] = {}


def register(name: str, check: Callable[[dict], None], make: Callable[..., Any]) -> None:
    """Register the producer ``name`` (a second registration of a name is refused, so two
    baselines cannot shadow each other)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a producer's name is an identifier, got {name!r}")
    if name in PRODUCERS:
        raise ValueError(f"a producer {name!r} is registered already")
    PRODUCERS[name] = Producer(check, make)


def unregister(name: str) -> None:
    """Remove the producer ``name`` (a test's, say); an unknown name is a ``KeyError``."""
    del PRODUCERS[name]
