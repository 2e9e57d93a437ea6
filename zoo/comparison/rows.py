"""The rows of :func:`zoo.compare`: what each row is (:class:`Row`) and what makes its posterior
(a family's fit by default, else the producer its name registered in
:mod:`zoo.baselines.producers`: a deep ensemble, a Laplace approximation), each checked before
any fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import guides
from zoo.baselines.ensembles import ENSEMBLE_OPTIONS
from zoo.baselines.producers import PRODUCERS, Producer
from zoo.results.posterior import Posterior
from zoo.training.fitting import fit as run_fit

__all__ = ["ENSEMBLE_OPTIONS", "PRODUCERS", "Producer", "Row", "check_row", "rows_of"]


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


def _fit_family(model_factory, family, options, train, args, progress) -> Posterior:
    guide = guides.family(family, **options) if options else family
    return run_fit(model_factory(), guide, train, **args)


def _check_family_name(name: str) -> None:
    """Refuse a row's family name that names nothing ``compare`` can fit, listing what can."""
    try:
        guides.get(name)
    except ValueError:
        composite = sorted(n for n in guides.registry.families() if guides.registry.is_composite(n))
        raise ValueError(
            f"unknown family {name!r}: a row is one of the families {guides.available()}, a "
            f"family over several sites {composite} (with its options), or a baseline "
            f"{' or '.join(repr(k) for k in sorted(PRODUCERS))}"
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
