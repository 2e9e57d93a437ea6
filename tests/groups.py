"""The tests' helpers take ``zoo.fit``'s options flat (``progress=False, jit=True``) and pass
them on as the option groups of :mod:`zoo.training.options`, as ``zoo.fit`` takes them (it refuses
the flat keywords: ``tests/zoo/test_options.py``)."""

from __future__ import annotations

import guides
from zoo.training.options import grouped as options_grouped


def grouped(guide=None, **options) -> dict:
    """``options`` as :func:`zoo.training.options.grouped` gives them; with ``guide``, also
    ``guide`` (built with ``guide_options`` when given)."""
    extra = options.pop("guide_options", None)
    if extra is not None and guide is None:
        raise TypeError("guide_options needs the guide: grouped(guide, guide_options=...)")
    out = options_grouped(options)
    if guide is not None:
        out["guide"] = guides.family(guide, **extra) if extra else guide
    return out
