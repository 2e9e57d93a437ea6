"""One guide whose posterior family is chosen per site by name patterns."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import torch

from guides.base import PerSiteGuide
from guides.checks import GuideStart, check_family_options, check_keywords
from guides.registry import available, get, is_per_site, per_site_families
from guides.site import SitePosterior, serving_class


class AutoMixed(PerSiteGuide, family="mixed", composite=True):
    """Per-site mixture of families, e.g. a structured last layer and diagonal elsewhere::

        guide = guides.AutoMixed(model, {"fc2.weight": "matrix_normal", "*": "diagonal"})
        guide = guides.AutoMixed(model, {"fc2.*": ("lowrank", {"rank": 5}), "*": "diagonal"})

    Parameters
    ----------
    model : callable
        The Pyro model.
    families : mapping
        ``fnmatch`` pattern over site names -> a family name (any of
        ``guides.available()``), a registered guide class, or ``(family, options)``. The first
        matching pattern wins (mapping order); every site must match one, so end with ``"*"``,
        and every pattern must match some site (a misspelt name is an error, not ignored).
    init_scale, init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`, shared by all families.
    """

    def __init__(
        self,
        model: Callable,
        families: Mapping,
        **start: Unpack[GuideStart],
    ):
        check_keywords(type(self).__name__, start, GuideStart)
        super().__init__(model, **start)
        if not isinstance(families, Mapping) or not families:
            raise ValueError("families must map at least one site pattern to a family")
        self._rules: list[tuple[str, type[SitePosterior], dict]] = []
        self._objectives: list[str] = []
        for pattern, spec in families.items():
            family, options = spec if isinstance(spec, tuple) else (spec, {})
            guide_cls = get(family) if isinstance(family, str) else family
            if not (isinstance(guide_cls, type) and issubclass(guide_cls, PerSiteGuide)):
                raise TypeError(
                    f"pattern {pattern!r} maps to {family!r}; use a family name "
                    f"{available()} or a PerSiteGuide subclass"
                )
            site_cls, site_options = guide_cls.site_spec(**options)
            if site_cls is None or not is_per_site(guide_cls):
                raise ValueError(
                    f"pattern {pattern!r} maps to {family!r}, a family over several sites; "
                    f"AutoMixed gives each site a per-site family: one of {per_site_families()}"
                )
            check_family_options(guide_cls, site_cls, site_options)
            self._rules.append((pattern, site_cls, site_options))
            self._objectives.append(guide_cls.OBJECTIVE)

    def objective(self) -> str:
        """What ``-loss`` bounds with these families: ``"conditional"`` when point masses sit
        beside Gaussians (a MAP body), ``"map"`` when all are point masses, else the first
        family's objective that is not the model's (WHVI's, MC dropout's), or ``"model"``."""
        objectives = getattr(self, "_objectives", [])  # a guide unpickled from version 1
        found = set(objectives)
        if "map" in found:
            return "map" if found == {"map"} else "conditional"
        return next((o for o in objectives if o != "model"), "model")

    @classmethod
    def last_layer(
        cls,
        model: Callable,
        family: str | type = "lowrank",
        options: Mapping | None = None,
        *,
        body: str | type = "map",
        **guide_options: Any,
    ) -> AutoMixed:
        """A Bayesian last layer: ``family`` on the sites of the model's last layer and ``body``
        (default the point mass: MAP) on every other site. With ``init_module=`` a trained
        network, "train, then make the last layer Bayesian" is one call::

            guide = guides.AutoMixed.last_layer(model, "lowrank", {"rank": 5}, init_module=net)

        The last layer is the one of the model's last weight site (``model.site_shapes``, in
        the order the model samples them), e.g. ``fc2`` for ``fc2.weight`` and ``fc2.bias``.
        """
        names = list(getattr(model, "site_shapes", None) or ())
        if not names:
            raise TypeError(
                "last_layer reads the layers from model.site_shapes (a zoo model); for another "
                "model name the sites: AutoMixed(model, {'<layer>.*': family, '*': 'map'})"
            )
        layer = names[-1].rsplit(".", 1)[0] if "." in names[-1] else names[-1]
        pattern = f"{layer}.*" if "." in names[-1] else layer
        rules = {pattern: (family, dict(options or {})), "*": body}
        return cls(model, rules, **guide_options)

    def spec(self) -> dict:
        """Plain data that rebuilds this guide: its rules as ``[pattern, family, options]``."""
        rules = [[p, *cls.guide_options(options)] for p, cls, options in self._rules]
        return {"family": "mixed", "rules": rules, "init_scale": self.init_scale}

    @classmethod
    def from_spec(cls, model: Callable, spec: dict) -> AutoMixed:
        """The guide that :meth:`spec` describes."""
        rules = {p: (family, _saved(family, options)) for p, family, options in spec["rules"]}
        return cls(model, rules, init_scale=spec["init_scale"])

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        unused = [p for p, _, _ in self._rules if not fnmatch.filter(self._site_names, p)]
        if unused:
            raise ValueError(
                f"AutoMixed patterns {unused} match no site of the model (a misspelt name?); "
                f"its sites are {self._site_names}"
            )

    def site_class_for(self, name: str, shape: torch.Size) -> type[SitePosterior]:
        for pattern, site_cls, _ in self._rules:
            if fnmatch.fnmatchcase(name, pattern):
                what = f"pattern {pattern!r} ({site_cls.family!r} family)"
                return serving_class(site_cls, name, shape, what)
        raise ValueError(
            f"No pattern in {[p for p, _, _ in self._rules]} matches site {name!r}; "
            "add a catch-all pattern such as '*': 'diagonal'."
        )

    def constrained_class_for(self, name: str) -> type[SitePosterior]:
        for pattern, site_cls, _ in self._rules:
            if fnmatch.fnmatchcase(name, pattern):
                return site_cls.constrained_class()
        return super().constrained_class_for(name)

    def site_options_for(self, name: str, cls: type[SitePosterior]) -> dict:
        for pattern, site_cls, options in self._rules:
            if fnmatch.fnmatchcase(name, pattern):
                return options if cls is site_cls else {}  # a fallback takes no options
        return {}


def _saved(family: str, options: dict) -> dict:
    """A saved rule's options as this release reads them (the family's
    :meth:`~guides.base.PerSiteGuide.read_options`)."""
    return get(family).read_options(options) if family in available() else dict(options)
