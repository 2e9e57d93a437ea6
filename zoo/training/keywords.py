"""How a producer takes "how to fit": :class:`HowToFit`, the one signature of ``zoo.fit``'s
arguments after the model, guide and data that every producer of a posterior (``zoo.laplace``,
``zoo.subnetwork_guide``, ``zoo.compare``, ``zoo.ensemble``) takes as ``**how`` and hands to its
fits; a field of a group passed as a keyword of its own refused, naming its group; the
arguments of a fit made on a caller's behalf."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, TypeVar, cast

from zoo.training.convergence import Convergence
from zoo.training.options import GROUPS, Engine, Loss, Optim, Run, flat_keywords, group

__all__ = ["FitLength", "HowToFit", "fit_arguments", "refuses_flat_keywords"]

F = TypeVar("F", bound=Callable[..., Any])


class FitLength(TypedDict, total=False):
    """How each fit of a producer runs, as ``zoo.fit`` takes it (every key optional, ``zoo.fit``'s
    default when left out): ``epochs``, ``num_steps`` (or ``"auto"``, a ``Convergence``),
    ``batch_size``, ``lr`` (or ``"auto"``), and the option groups ``optim``, ``loss``, ``engine``,
    ``run`` (each a group or a dict of its fields; a group's field passed flat is refused, naming
    the group). ``zoo.ensemble`` takes these (its ``seed`` is its own: member ``k`` gets
    ``seed + k``)."""

    epochs: int | None
    num_steps: int | str | Convergence | None
    batch_size: int | None
    lr: float | str | None
    optim: Optim | Mapping | None
    loss: Loss | Mapping | None
    engine: Engine | Mapping | None
    run: Run | Mapping | None


class HowToFit(FitLength, total=False):
    """:class:`FitLength` and the fit's ``seed`` (``zoo.fit``'s: 0 when left out; ``None``
    draws from the global generators): what ``zoo.laplace``, ``zoo.subnetwork_guide`` and
    ``zoo.compare`` take as ``**how`` and hand to their fits (``tests/test_types.py`` holds the
    keys to ``zoo.fit``'s)."""

    seed: int | None


def refuses_flat_keywords(function: F, groups: Mapping[str, type] = GROUPS) -> F:
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

    return cast(F, wrapper)


def fit_arguments(progress: bool, how: Mapping, caller: str, keys: type = HowToFit) -> dict:
    """``zoo.fit``'s keyword arguments for a fit made on ``caller``'s behalf (an ensemble's
    members, ``laplace``'s MAP fit, ``compare``'s rows): ``how`` (a :class:`HowToFit`, or the
    TypedDict ``keys`` names; another key is refused, naming ``caller`` and the keys it takes),
    each group checked now (:func:`group`), with the fit's progress bar set by ``progress``
    unless a ``run`` group is given (then its own ``progress`` rules)."""
    unknown = sorted(set(how) - set(keys.__annotations__))
    if unknown:
        more = f" (and {unknown[1:]})" if len(unknown) > 1 else ""
        raise TypeError(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}{more}: it takes its "
            f"own and zoo.fit's {sorted(keys.__annotations__)}"
        )
    out = {k: v for k, v in how.items()}
    for name, cls in GROUPS.items():
        if out.get(name) is not None:
            out[name] = group(cls, out[name])
    if out.get("run") is None:
        out["run"] = Run(progress=progress)
    return out
