"""One guide whose posterior family is chosen per site by name patterns."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from guides.base import PerSiteGuide, SitePosterior, check_family_options
from guides.registry import get


class AutoMixed(PerSiteGuide):
    site_class = None

    """Per-site mixture of families, e.g. a structured last layer and diagonal elsewhere::

        guide = guides.AutoMixed(model, {"fc2.weight": "matrix_normal", "*": "diagonal"})
        guide = guides.AutoMixed(model, {"fc2.*": ("lowrank", {"rank": 5}), "*": "diagonal"})

    Parameters
    ----------
    model : callable
        The Pyro model.
    families : mapping
        ``fnmatch`` pattern over site names -> a family name, a guide class, or
        ``(family, options)``. The first matching pattern wins (mapping order); every site must
        match one, so end with ``"*"``.
    init_scale, init_loc, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`, shared by all families.
    """

    def __init__(self, model, families: Mapping, **kwargs):
        super().__init__(model, **kwargs)
        if not families:
            raise ValueError("families must map at least one site pattern to a family")
        self._rules = []
        for pattern, spec in families.items():
            family, options = spec if isinstance(spec, tuple) else (spec, {})
            guide_cls = get(family) if isinstance(family, str) else family
            site_cls, site_options = guide_cls.site_spec(**options)
            check_family_options(guide_cls, site_cls, site_options)
            self._rules.append((pattern, site_cls, site_options))

    def site_class_for(self, name, shape) -> type[SitePosterior]:
        for pattern, site_cls, _ in self._rules:
            if fnmatch.fnmatchcase(name, pattern):
                if not site_cls.supports(shape):
                    raise ValueError(
                        f"Pattern {pattern!r} gives site {name!r} (shape {tuple(shape)}) the "
                        f"{site_cls.family!r} family, which cannot serve it; map it to "
                        "'diagonal', 'lowrank' or 'tridiagonal' with an earlier pattern."
                    )
                return site_cls
        raise ValueError(
            f"No pattern in {[p for p, _, _ in self._rules]} matches site {name!r}; "
            "add a catch-all pattern such as '*': 'diagonal'."
        )

    def site_options_for(self, name, cls) -> dict:
        for pattern, _, options in self._rules:
            if fnmatch.fnmatchcase(name, pattern):
                return options
        return {}
