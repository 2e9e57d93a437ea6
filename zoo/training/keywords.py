"""How a producer takes its option groups: a field passed as a keyword of its own refused
(naming its group), and the arguments of a fit made on a caller's behalf."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

from zoo.training.options import GROUPS, Run, flat_keywords, group

__all__ = ["fit_arguments", "refuses_flat_keywords"]


def refuses_flat_keywords(function: Callable, groups: Mapping[str, type] = GROUPS) -> Callable:
    """``function`` (whose group parameters are ``groups``) refusing, before any work, a field
    of a group passed as a keyword of its own (the flat keywords removed in 0.3.0) with a
    ``TypeError`` that names the group to pass it in; every other call is ``function``'s."""
    own = set(inspect.signature(function).parameters)  # e.g. ensemble's own progress bar
    owners = {k: v for k, v in flat_keywords(groups).items() if k not in own}
    name = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "guide_options" in kwargs:
            raise TypeError(
                f"{name}() takes no guide_options=: pass guides.family(name, **options) as the "
                "guide (guides.family('lowrank', rank=5))"
            )
        flat = [k for k in kwargs if k in owners]
        if flat:
            hints = ", ".join(
                f"{k}= in {owners[k]}=zoo.{groups[owners[k]].__name__}({k}=...)" for k in flat
            )
            raise TypeError(f"{name}() takes its options in groups: pass {hints}")
        return function(*args, **kwargs)

    return wrapper


def fit_arguments(progress: bool, **arguments) -> dict:
    """``zoo.fit``'s keyword arguments for a fit made on a caller's behalf (an ensemble's
    members, ``laplace``'s MAP fit, ``compare``'s rows): ``arguments`` (``zoo.fit``'s named
    arguments and groups, each group checked now: :func:`group`), with the fit's progress bar
    set by ``progress`` unless a ``run`` group is given (then its own ``progress`` rules)."""
    out = dict(arguments)
    for name, cls in GROUPS.items():
        if out.get(name) is not None:
            out[name] = group(cls, out[name])
    if out.get("run") is None:
        out["run"] = Run(progress=progress)
    return out
