"""What every kind of posterior is: the parts it holds (:class:`PosteriorParts`, a protocol
every registered kind satisfies: ``tests/zoo/results/test_posterior.py``), how a prediction is
asked of it (:class:`PredictOptions`), and the kinds, registered by their class statements
(``class FitResult(Posterior, kind="fit")``: :data:`KINDS`), from which ``zoo.load`` reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch

__all__ = [
    "KINDS",
    "Drawing",
    "PosteriorParts",
    "PredictOptions",
    "Readers",
    "register_kind",
]

#: Every registered kind of posterior: ``kind`` (a saved file's entry) -> its class.
KINDS: dict[str, Any] = {}  # the classes (typed Any: each has its own `read`)


def register_kind(kind: str, cls: type) -> None:
    """Register ``cls`` under ``kind`` (done by the class statement); a name another class
    holds, or that is not an identifier, is refused. The same class defined again (its module
    and qualified name: a module reloaded) takes its place."""
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"a posterior kind must be a Python identifier, got {kind!r}")
    held = KINDS.get(kind)
    if held is not None and _name(held) != _name(cls):
        raise ValueError(
            f"the posterior kind {kind!r} is {_name(held)}'s already, so {_name(cls)} cannot "
            f"claim it (it would read every {kind!r} file): give {cls.__qualname__} a kind of "
            "its own"
        )
    KINDS[kind] = cls


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Readers(Mapping):
    """``kind -> reader`` (``(payload, path, model, map_location) -> Posterior``), read live
    from :data:`KINDS`: a kind registered later is readable at once."""

    def __getitem__(self, kind: str) -> Any:
        return KINDS[kind].read

    def __iter__(self) -> Iterator[str]:  # sorted: the same order whatever was imported first
        return iter(sorted(KINDS))

    def __len__(self) -> int:
        return len(KINDS)


@runtime_checkable
class PosteriorParts(Protocol):
    """What every kind holds, as fields or properties: ``model`` (the Pyro model whose
    likelihood scores predictions), ``device`` (where it predicts), ``options`` (how it was
    made, plain data or an options group) and ``wall_time`` (seconds it took)."""

    model: Any
    device: torch.device
    options: Any
    wall_time: float


class Drawing(TypedDict, total=False):
    """The options of how a posterior's networks are drawn and run, which
    :meth:`Posterior.predict`, :meth:`~Posterior.evaluate` and :meth:`~Posterior.to_arviz`
    share as keywords (their meaning: :class:`PredictOptions`' fields of the same names).

    seed : int or None, default 0
        Fixes the draws, the caller's random state untouched; ``None`` draws from the global
        generators.
    progress : bool, default True
        A progress bar once a prediction runs two seconds.
    threads : "auto", int or None, default "auto"
        CPU threads of the passes, ``zoo.fit``'s rule (the caller's setting restored after).
    distributed : bool, default False
        On every rank of a distributed run: the inputs are sharded over the ranks and the
        outputs gathered once.
    """

    seed: int | None
    progress: bool
    threads: int | str | None
    distributed: bool


@dataclass(frozen=True)
class PredictOptions:
    """How a prediction is made, checked once by :meth:`Posterior.predict` and handed to a
    kind's own code.

    Attributes
    ----------
    num_samples : int or None
        ``S``, the sampled networks (or functions) of the predictive (``None``: every draw a
        reference holds).
    batch_size, sample_batch_size : int or None
        Inputs and draws per pass (``None``: the predictive's choice,
        :func:`zoo.evaluation.predictive.predict`).
    seed : int or None
        Fixes the draws without touching the caller's random state (``None``: the global
        generators).
    progress : bool
        A progress bar once a prediction runs two seconds.
    threads : "auto", int or None
        CPU threads of the passes, ``zoo.fit``'s rule (:mod:`zoo.runtime.threads`).
    distributed : bool
        Called on every rank of a distributed run: the inputs are sharded over the ranks and
        the outputs gathered once; every rank returns the same prediction.
    """

    num_samples: int | None
    batch_size: int | None = None
    sample_batch_size: int | None = None
    seed: int | None = 0
    progress: bool = True
    threads: int | str | None = "auto"
    distributed: bool = False
