"""The family cases that every shared test runs, read from the registry in one place.

A family in ``guides/`` (registered by its class statement) and each of its ``variants`` become
one case, labelled ``name`` or ``name_variant`` (``lowrank_constant``, ``tridiagonal_free``, ...).
``GAUSSIAN`` holds the cases whose sites are Gaussian: the shared distribution tests check those
against a dense ``MultivariateNormal``; the others (MC dropout, the point mass) have their own
modules with their own independent references.

Families that a test module defines for a while (outside ``guides/``) are left out here; such a
module runs the shared checks on its family itself.
"""

from __future__ import annotations

import torch

import guides
from guides.gaussian import GaussianMixin


def _cases() -> dict[str, tuple[str, dict]]:
    cases = {}
    for name, cls in guides.registry.families().items():
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


def _is_gaussian(label: str) -> bool:
    site_cls, options = site_case(label)
    return isinstance(site_cls(torch.ones(3, 4), 0.1, **options).distribution(), GaussianMixin)


#: The cases whose weight sites are Gaussian (every ``q`` with a dense covariance to check).
GAUSSIAN: dict[str, tuple[str, dict]] = {
    label: case for label, case in CASES.items() if _is_gaussian(label)
}
