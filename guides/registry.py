"""The registry of posterior families: a family registers itself by defining its class.

::

    class AutoMyFamily(guides.PerSiteGuide, family="my_family"):
        site_class = MySite

makes ``"my_family"`` a name that ``zoo.fit``, ``guides.AutoMixed``, ``zoo.compare`` (whose
default is every registered family), the CLI and ``zoo.load`` accept. Composite guides (such as
:class:`guides.AutoMixed`) register with ``composite=True``: they can be rebuilt from a saved
spec, but they are not families of their own and are not listed by :func:`available`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pyro.infer.autoguide import AutoGuide

from guides.checks import is_number

#: What a fit's ELBO can be a bound of (:meth:`guides.base.PerSiteGuide.objective`): the
#: evidence of the model as written; that of WHVI's own model (its ``N(0, I)`` prior on ``g``,
#: learned scales); the evidence given the point masses of some weights (their values fitted
#: by the likelihood and prior: a subnetwork's rest, a MAP body); a penalised likelihood, no
#: bound (a point mass); MC dropout's, whose nearly degenerate ``q`` puts ``-n log sigma`` in
#: it.
OBJECTIVES = ("model", "whvi_model", "conditional", "map", "mc_dropout")


@dataclass(frozen=True)
class Recipe:
    """How a family is fitted when the caller does not say: what ``zoo.fit``, ``zoo.compare``
    and the CLI use unless given their own values.

    Parameters
    ----------
    lr_scale : float, default 1.0
        Multiplies the task's default learning rate (``zoo.fit``'s: 3e-3 decaying tenfold
        over the run, or the full-batch recipe's 1e-2 for small regression data) when no
        ``lr`` is given. A family whose parameters move the posterior
        slowly per Adam step learns at a larger rate, one whose parameters move it fast (many
        entries of a factor per weight) at a smaller one.
    full_batch_lr_scale : float, optional
        The scale under the full-batch recipe of small regression data
        (``zoo.REGRESSION_FIT``) where it differs from ``lr_scale``: a family may learn best
        at one scale of a minibatch rate and another of the full-batch one.
    elbo : {"trace", "meanfield"}, optional
        The ELBO a fit uses when the caller does not say (``zoo.Loss(elbo=None)``): Monte Carlo
        KL (``"trace"``, used where this is ``None``) or the closed-form KL.
    estimator : {"reparam", "local", "flipout", "auto"}, optional
        How a fit's layers see the weights when the caller does not say
        (``zoo.Loss(estimator=None)``; ``"reparam"`` where this is ``None``). ``"auto"``: the
        local reparameterisation on each layer where the family's distribution prefers it
        (``prefers_local``), a shared draw elsewhere and with several particles.
    map_start : bool, default True
        Whether a fit from scratch of this family starts with a MAP phase where ``zoo.fit``'s
        rule applies (:mod:`zoo.training.map_start`); ``False`` for a family whose own start
        fits better than the MAP weights do (MC dropout's).
    map_start_options : dict, optional
        The constructor options the family is built with after a MAP phase when the caller
        named it without options (``"tridiagonal"``, not ``guides.family("tridiagonal",
        ...)``): a parameterisation that fits from given weights better than the default does.
    why : str
        The measurement behind a scale other than 1 (``benchmarks/fairness.py`` at ``cc5a66b``,
        ``benchmarks/task_rate.py`` at ``c1c13dd``), or behind a loss of the family's own.

    Notes
    -----
    The other parts of a family's recipe are its constructor's defaults (``init_scale``, the
    parameterisation), shown with ``lr_scale`` in the documentation's family table.
    """

    lr_scale: float = 1.0
    full_batch_lr_scale: float | None = None
    elbo: str | None = None
    estimator: str | None = None
    map_start: bool = True
    map_start_options: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def __post_init__(self):
        for name, value, choices in (
            ("elbo", self.elbo, ("trace", "meanfield")),
            ("estimator", self.estimator, ("reparam", "local", "flipout", "auto")),
        ):
            if value is not None and value not in choices:
                raise ValueError(f"Recipe({name}={value!r}): one of {choices} or None")
        for name in ("lr_scale", "full_batch_lr_scale"):
            value = getattr(self, name)
            if name == "lr_scale" or value is not None:
                if not is_number(value) or not value > 0 or not math.isfinite(value):
                    raise ValueError(f"Recipe({name}={value!r}): a finite positive number")

    def scale(self, full_batch: bool) -> float:
        """The factor of the task's default rate: ``full_batch_lr_scale`` under the full-batch
        recipe when it is set, else ``lr_scale``."""
        if full_batch and self.full_batch_lr_scale is not None:
            return self.full_batch_lr_scale
        return self.lr_scale


def family_class(guide: Any) -> type:
    """The guide class of a family name, a guide class, a ``guides.family(...)`` spec or a
    guide instance."""
    if isinstance(guide, str):
        return get(guide)
    if isinstance(guide, type):
        return guide
    if isinstance(guide, Family):
        return guide.cls
    return type(guide)


def recipe(guide: Any) -> Recipe:
    """The recipe of a family name, a guide class, a ``guides.family(...)`` spec or a guide
    instance (its class's ``RECIPE``); a guide of another library gets ``Recipe()``."""
    found = getattr(family_class(guide), "RECIPE", None)
    return found if isinstance(found, Recipe) else Recipe()


_FAMILIES: dict[str, type[Any]] = {}
_COMPOSITES: set[str] = set()


def register(name: str, cls: type[Any], composite: bool = False) -> None:
    """Register ``cls`` under ``name`` (done by ``class X(PerSiteGuide, family=name)``)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a family name must be a Python identifier, got {name!r}")
    held = _FAMILIES.get(name)
    if held is not None and _qualified(held) != _qualified(cls):
        raise ValueError(
            f"family name {name!r} is already registered by {_qualified(held)}; choose another "
            f"name for {_qualified(cls)} (or unregister the first)"
        )
    _FAMILIES[name] = cls
    if composite:
        _COMPOSITES.add(name)
    else:
        _COMPOSITES.discard(name)


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for families defined for a while, e.g. in a test)."""
    _FAMILIES.pop(name, None)
    _COMPOSITES.discard(name)


def is_composite(name: str) -> bool:
    """Whether family ``name`` is registered as a family over several sites (a joint
    Gaussian, a subnetwork, a mix per layer), not one of :func:`available`'s per-site ones."""
    return name in _COMPOSITES


def composites() -> list[str]:
    """Names of the registered families over several sites (``joint``, ``mixed``): built with
    their own arguments, outside :func:`available`'s list of per-site families."""
    return sorted(_COMPOSITES & set(_FAMILIES))


def available() -> list[str]:
    """Names of the posterior families, accepted by :func:`get` and by ``zoo.fit(model, name,
    data)``; the default of ``zoo.compare``."""
    return sorted(n for n in _FAMILIES if n not in _COMPOSITES)


def is_per_site(cls: type[Any]) -> bool:
    """Whether guide class ``cls`` is a per-site family, whose options are its site class's:
    one that can serve some sites of another guide (a rule of ``guides.AutoMixed``, the rest of
    ``guides.AutoJoint``). A family over several sites (``joint``, ``mixed``) or one built from
    its own arguments (``subnetwork``) is not."""
    name = getattr(cls, "family", None) or ""
    return not (getattr(cls, "options_in_init", False) or is_composite(name))


def per_site_families() -> list[str]:
    """Names of :func:`available` that are per-site families (:func:`is_per_site`)."""
    return [name for name in available() if is_per_site(_FAMILIES[name])]


def families() -> dict[str, type[Any]]:
    """``{name: guide class}`` of every family, in :func:`available` order."""
    return {name: _FAMILIES[name] for name in available()}


def get(name: str) -> type[Any]:
    """The guide class registered under ``name``, e.g. ``get("tridiagonal")``."""
    if not isinstance(name, str) or name not in _FAMILIES:
        raise ValueError(f"Unknown guide family {name!r}; known families are {available()}")
    return _FAMILIES[name]


def build(model: Callable, spec: dict) -> Any:
    """A new guide of ``model`` from a spec written by ``guide.spec()`` (plain data): the
    family's class found by name, built with the saved options; its parameters are created on
    its first call and then loaded from a state dict by the caller."""
    if not isinstance(spec, dict) or "family" not in spec:
        raise ValueError(f"a guide spec is a dict with a 'family' key, got {spec!r}")
    return get(spec["family"]).from_spec(model, spec)


def instantiate(guide: Any, model: Callable, options: dict) -> Any:
    """The guide ``zoo.fit`` (or ``zoo.lightning``) was given, built: a family name or a class
    as ``cls(model, **options)``, a callable ``model -> guide``, or an instance as is."""

    if isinstance(guide, str):
        return get(guide)(model, **options)
    if isinstance(guide, AutoGuide):
        if options:
            raise ValueError("guide_options apply only when guide is a name or a class")
        return guide
    if callable(guide):  # a class or a factory
        factory: Callable[..., Any] = guide
        built = factory(model, **options)
        if inspect.isclass(guide):
            return built
        if not isinstance(built, torch.nn.Module):
            raise TypeError("a guide factory must return a torch.nn.Module guide")
        return built
    raise TypeError(
        f"guide must be a family name {available()}, an AutoGuide class, a "
        f"callable model -> guide, or a guide instance; got {type(guide).__name__}"
    )


class Family:
    """A family with its options, built for a model when called: what :func:`family` returns
    and ``zoo.fit`` takes as its guide."""

    def __init__(self, guide: str | type, options: dict):
        self.guide, self.options = guide, dict(options)

    @property
    def cls(self) -> type:
        """The family's guide class."""
        return get(self.guide) if isinstance(self.guide, str) else self.guide

    def __call__(self, model):
        return self.cls(model, **self.options)

    def __repr__(self) -> str:
        name = self.guide if isinstance(self.guide, str) else self.guide.__name__
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"guides.family({name!r}{options})"


def family(guide: str | type, **options: Any) -> Family:
    """A family name (or guide class) with its options, as ``zoo.fit``, ``zoo.compare`` and
    ``BayesianModule`` take a guide: ``zoo.fit(model, guides.family("lowrank", rank=5), data)``
    builds ``AutoLowRank(model, rank=5)`` (a name is looked up now; the options are checked
    when the guide is built, before any step)."""

    if not (isinstance(guide, str) or inspect.isclass(guide)):
        raise TypeError(f"guides.family takes a family name or a guide class, got {guide!r}")
    spec = Family(guide, options)
    _ = spec.cls  # an unknown name fails here
    return spec


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
