"""The rows of :func:`zoo.compare`: what each row is (:class:`Row`) and what makes its posterior
(:data:`PRODUCERS`, keyed by kind, laplace-torch's factory style: a family's fit by default, a
deep ensemble, a Laplace approximation), each checked before any fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import guides
from zoo.baselines.ensembles import check_ensemble, ensemble
from zoo.baselines.laplace_fitting import check_pairing, laplace
from zoo.results.laplace_torch import LaplaceOptions
from zoo.results.posterior import Posterior
from zoo.training.fitting import fit as run_fit

__all__ = ["ENSEMBLE_OPTIONS", "PRODUCERS", "Producer", "Row", "check_row", "rows_of"]

#: What an ``"ensemble"`` row may set (:func:`zoo.ensemble`'s options).
ENSEMBLE_OPTIONS = frozenset({"members", "family", "seed", "processes", "noise"})


@dataclass(frozen=True)
class Row:
    """One row of :func:`zoo.compare`.

    Attributes
    ----------
    label : str
        The row's name in the table.
    family : str, a ``guides.family(...)`` spec, or None
        What makes the posterior: a family name, a kind of :data:`PRODUCERS` (``"ensemble"``,
        ``"laplace"``); ``None`` for a posterior given.
    options : dict
        The family's or producer's options.
    fit_options : dict
        ``zoo.fit`` arguments of this row only (over the call's).
    posterior : Posterior or None
        A posterior already made (nothing is fitted).
    """

    label: str
    family: Any = None
    options: dict = field(default_factory=dict)
    fit_options: dict = field(default_factory=dict)
    posterior: Posterior | None = None

    @classmethod
    def of(cls, spec: Any) -> Row:
        """The row of one entry of ``compare``'s ``guides``: a family name, ``(label, family,
        options)``, ``(label, family, options, fit_options)`` or ``(label, posterior)``."""
        if isinstance(spec, str):
            return cls(spec, spec)
        if isinstance(spec, tuple) and len(spec) == 2:
            label, value = spec
            if isinstance(value, Posterior):
                return cls(str(label), posterior=value)
            if isinstance(value, str) or not isinstance(value, tuple):
                return cls(str(label), value)
        if isinstance(spec, tuple) and len(spec) in (3, 4):
            label, family, options, *own = spec
            return cls(label, family, dict(options), dict(own[0]) if own else {})
        raise ValueError(
            "each entry of guides is a family name, (label, family, guide_options), "
            "(label, family, guide_options, fit_options) or (label, posterior); a mapping is "
            f"{{label: family or posterior}}; got {spec!r}"
        )

    @property
    def producer(self) -> Producer | None:
        """What makes the row when it is not a family's fit (:data:`PRODUCERS`), else ``None``."""
        return PRODUCERS.get(self.family) if isinstance(self.family, str) else None

    def check(self) -> None:
        """Refuse a row that could not run, before any fit: its producer's options, or a
        family name that names nothing."""
        try:
            producer = self.producer
            if producer is not None:
                producer.check(self.options)
            elif isinstance(self.family, str):
                _check_family_name(self.family)
        except (TypeError, ValueError) as err:
            raise ValueError(f"the {self.family} row {self.label!r}: {err}") from None

    def produce(
        self, model_factory: Callable | None, train: Any, args: dict, progress: bool
    ) -> Posterior:
        """The row's posterior: the one given, or its producer's (a family's fit by default)
        with the row's ``zoo.fit`` arguments ``args``."""
        if self.posterior is not None:
            return self.posterior
        make = _fit_family if self.producer is None else self.producer.make
        return make(model_factory, self.family, self.options, train, dict(args), progress)


@dataclass(frozen=True)
class Producer:
    """What makes a kind of row: ``check(options)`` before any fit, and ``make(model_factory,
    family, options, train, fit_args, progress) -> Posterior``."""

    check: Callable[[dict], None]
    make: Callable[..., Posterior]


def _check_ensemble(options: dict) -> None:
    if not set(options) <= ENSEMBLE_OPTIONS:
        raise ValueError(f"it takes the options {sorted(ENSEMBLE_OPTIONS)}, got {sorted(options)}")
    check_ensemble(**{"members": 5, "family": "map", "seed": 0, **options})


def _make_ensemble(model_factory, family, options, train, args, progress) -> Posterior:
    own = {k: args.pop(k) for k in ("seed",) if k in args}
    return ensemble(model_factory, train, **{**own, **options}, progress=progress, **args)


#: What a ``"laplace"`` row takes beside :class:`LaplaceOptions`' fields: :func:`zoo.laplace`'s
#: ``at`` and ``validation``.
LAPLACE_CALL = ("at", "validation")


def _check_laplace(options: dict) -> None:
    at = options.get("at")
    if at not in (None, "module"):
        raise ValueError(f"'at' is 'module' (post-hoc, no MAP fit) or left out, got {at!r}")
    fields = LaplaceOptions.of({k: v for k, v in options.items() if k not in LAPLACE_CALL})
    check_pairing(fields.prior_precision, options.get("validation") is not None,
                  "a zoo.compare 'laplace' row")  # fmt: skip


def _make_laplace(model_factory, family, options, train, args, progress) -> Posterior:
    options = dict(options)
    at = options.pop("at", None)  # "module": post-hoc at a trained network's weights
    validation = options.pop("validation", None)  # gridsearch's held-out data
    return laplace(model_factory(), train, at=at, options=options, validation=validation,
                   progress=progress, **args)  # fmt: skip


def _fit_family(model_factory, family, options, train, args, progress) -> Posterior:
    guide = guides.family(family, **options) if options else family
    return run_fit(model_factory(), guide, train, **args)


#: The producers of rows that are not a family's fit, keyed by the row's ``family``.
PRODUCERS: dict[str, Producer] = {
    "laplace": Producer(_check_laplace, _make_laplace),
    "ensemble": Producer(_check_ensemble, _make_ensemble),
}


def _check_family_name(name: str) -> None:
    """Refuse a row's family name that names nothing ``compare`` can fit, listing what can."""
    try:
        guides.get(name)
    except ValueError:
        composite = sorted(n for n in guides.families() if guides.registry.is_composite(n))
        raise ValueError(
            f"unknown family {name!r}: a row is one of the families {guides.available()}, a "
            f"family over several sites {composite} (with its options), or a baseline "
            f"{' or '.join(repr(k) for k in PRODUCERS)}"
        ) from None


def check_row(spec: Any) -> None:
    """Refuse an entry of ``compare``'s ``guides`` (in any of its forms) that could not run,
    before any fit (:meth:`Row.check`)."""
    Row.of(spec).check()


def rows_of(entries: Any) -> list[Row]:
    """Every row of ``compare``'s ``guides`` (a sequence or a mapping), each checked before
    any fit; labels must be unique."""
    if isinstance(entries, Mapping):
        entries = list(entries.items())
    else:
        entries = list(entries)
    if not entries:
        raise ValueError("guides is empty: name at least one family (guides.available())")
    rows = [Row.of(spec) for spec in entries]
    for row in rows:
        row.check()
    labels = [row.label for row in rows]
    if len(set(labels)) < len(labels):
        raise ValueError(f"the rows' labels must be unique, got {labels}")
    return rows
