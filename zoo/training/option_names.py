"""Where an option lives: a keyword of ``zoo.fit`` itself or a field of one of its groups
(``zoo.Optim``, ``zoo.Loss``, ``zoo.Engine``, ``zoo.Run``), so that an option given to the wrong
group is refused with the place it belongs (``zoo.Optim(lr=0.01)``: the rate is
``zoo.fit(lr=...)``), before any work."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

__all__ = ["FIT_KEYWORDS", "OptionGroup", "misplaced"]

#: ``zoo.fit``'s own keywords after the model, guide and data, besides its groups
#: (``zoo.training.keywords.HowToFit``'s; ``tests/zoo/training/test_option_names.py`` holds
#: the two equal).
FIT_KEYWORDS = ("epochs", "num_steps", "batch_size", "lr", "seed")
_GROUPS: dict[str, type] = {}


class OptionGroup:
    """A group of ``zoo.fit``'s options (a frozen dataclass): a keyword that is none of its
    fields is refused with a ``TypeError`` saying where it belongs (:func:`misplaced`), where
    the dataclass would say only that it is unexpected."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _GROUPS[cls.__name__] = cls

    def __new__(cls, *args, **kwargs):
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = [k for k in kwargs if k not in fields]
        if unknown:
            raise TypeError(misplaced(cls, unknown))
        return super().__new__(cls)


def misplaced(cls: type, names: Iterable[str]) -> str:
    """Why ``cls`` (a group) takes none of ``names``, and where each belongs: ``zoo.fit``'s own
    keyword, another group's field, or the closest of ``cls``'s own fields."""
    fields = [f.name for f in dataclasses.fields(cls)]
    hints = []
    for name in sorted(names):
        if name in FIT_KEYWORDS:
            hints.append(f"{name!r} is zoo.fit's own: zoo.fit(..., {name}=...)")
            continue
        owner = next((g for g, c in _GROUPS.items() if g != cls.__name__
                      and name in {f.name for f in dataclasses.fields(c)}), None)  # fmt: skip
        if owner is not None:
            hints.append(f"{name!r} belongs to zoo.{owner}: zoo.{owner}({name}=...)")
            continue
        close = difflib.get_close_matches(name, fields, n=1)
        hints.append(f"{name!r} is no option" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"zoo.{cls.__name__} has no option {sorted(names)}: "
        + "; ".join(hints)
        + (f". Its options: {', '.join(fields)}")
    )
