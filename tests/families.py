"""The family cases that every shared test runs, read from the registry in one place.

A family in ``guides/`` (registered by its class statement) and each of its ``variants`` become
one case, labelled ``name`` or ``name_variant`` (``lowrank_constant``, ``tridiagonal_free``, ...).
Families that a test module defines for a while (outside ``guides/``) are left out here; such a
module runs the shared checks of ``tests/harness.py`` on its family itself.
"""

from __future__ import annotations

import guides


def _cases() -> dict[str, tuple[str, dict]]:
    cases = {}
    for name, cls in guides.families().items():
        if not cls.__module__.startswith("guides."):
            continue
        for variant, options in cls.variants.items():
            cases[f"{name}_{variant}" if variant else name] = (name, dict(options))
    return cases


#: label -> (family name, guide options)
CASES: dict[str, tuple[str, dict]] = _cases()
#: One case per family, its default configuration: for the expensive tests (real data).
PRIMARY: dict[str, tuple[str, dict]] = {
    label: case for label, case in CASES.items() if label == case[0]
}


def site_case(label: str) -> tuple[type, dict]:
    """The site class and site options of case ``label``."""
    name, options = CASES[label]
    return guides.get(name).site_spec(**options)
