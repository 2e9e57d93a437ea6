"""The tests' helpers take ``zoo.fit``'s options flat (``progress=False, jit=True``) and pass
them on as the option groups of :mod:`zoo.options`, so that no test goes through the deprecated
flat keywords (``tests/zoo/test_options.py`` tests those)."""

from __future__ import annotations

import dataclasses

import guides
from zoo.options import GROUPS, flat_keywords, group


def grouped(guide=None, **options) -> dict:
    """``options`` with every flat field moved into its group (merged into a group given too);
    with ``guide``, also ``guide`` (built with ``guide_options`` when given)."""
    owners = flat_keywords()
    out = {k: v for k, v in options.items() if k not in owners and k != "guide_options"}
    for key, value in options.items():
        if key in owners:
            name = owners[key]
            current = group(GROUPS[name], out.get(name))
            out[name] = dataclasses.replace(current, **{key: value})
    if guide is not None:
        extra = options.get("guide_options")
        out["guide"] = guides.family(guide, **extra) if extra else guide
    return out
