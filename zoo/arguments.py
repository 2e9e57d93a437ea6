"""Checks of plain arguments, in one place for the whole library: the primitives
(:func:`check_int`, :func:`check_bool`, :func:`check_choice`, :func:`check_keywords`,
defined in :mod:`guides.checks`, the bottom of the import graph, so that the families use
them too; :func:`check_positive`, :func:`check_seed`) and the checks of the entry points'
shared arguments (``zoo.fit``, ``predict``, ``reference``, ``compare``). Each refuses a value
that cannot be right before any work, with a message that says what was given, where, and
what to pass instead; the option groups and the families call these for their own fields."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from guides.checks import (
    InvalidArgument,
    check_bool,
    check_choice,
    check_int,
    check_keywords,
    is_int,
    is_number,
)

__all__ = [
    "InvalidArgument",
    "MAX_SEED",
    "check_bool",
    "check_choice",
    "check_int",
    "check_keywords",
    "is_int",
    "is_number",
    "check_checkpoint_path",
    "check_factor",
    "check_length",
    "check_positive",
    "check_seed",
    "refuses_moved_keywords",
]

#: Seeds are integers in ``[0, MAX_SEED)``: what torch's generators take.
MAX_SEED = 2**63


def check_seed(seed, name: str = "seed") -> None:
    """Refuse a seed that is not ``None`` or an integer in ``[0, 2**63)``."""
    if seed is None:
        return
    if not is_int(seed) or not 0 <= seed < MAX_SEED:
        raise ValueError(
            f"{name} must be None (the global generators as they are) or an integer in "
            f"[0, 2**63), got {seed!r}"
        )


def check_length(epochs, num_steps) -> None:
    """``epochs`` and ``num_steps`` are two ways to say one thing: refuse both at once."""
    if epochs is not None and num_steps is not None:
        raise ValueError(
            f"pass epochs= or num_steps=, not both (got epochs={epochs!r}, "
            f"num_steps={num_steps!r}): num_steps counts optimiser steps across epochs"
        )


def check_checkpoint_path(path) -> None:
    """Refuse a checkpoint path that names a folder, or whose folder cannot be made or
    written, before the fit starts (a fit would otherwise fail at its first checkpoint)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint={str(path)!r} is a folder; pass a file path in it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"checkpoint={str(path)!r}: its folder cannot be made ({err.strerror}); pass a "
            "path in a folder you can write"
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"checkpoint={str(path)!r}: its folder {str(path.parent)!r} is not writable; pass "
            "a path in a folder you can write"
        )


def check_factor(name: str, schedule: Callable[[int], float], steps=(0,)) -> None:
    """Call ``schedule`` at ``steps`` and refuse a value that is not a finite number >= 0: a
    negative learning-rate factor is gradient ascent, a NaN ruins the first step."""
    for step in steps:
        try:
            value = schedule(step)
        except Exception as err:
            raise ValueError(
                f"{name} raised {type(err).__name__} at step {step}: {err}; it must take the "
                "step (an int) and return a number >= 0"
            ) from err
        ok = is_number(value)
        if torch.is_tensor(value) and value.numel() == 1:
            ok, value = True, value.item()
        if not ok or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{name} gave {value!r} at step {step}: it must return a finite number >= 0 "
                "(a negative factor turns the step round: it climbs the loss)"
            )


#: The counts among :func:`check_positive`'s names (a positive integer, not only a number).
INTEGERS = (
    "epochs",
    "batch_size",
    "num_particles",
    "num_steps",
    "checkpoint_every",
    "accumulate",
    "num_nodes",
    "num_samples",
    "sample_batch_size",
    "chains",
    "draws",
    "chunk",
    "max_tree_depth",
)


def check_positive(**values) -> None:
    """Refuse a value that is not a positive number (a positive integer for counts); None
    means "not given" and passes."""
    for name, value in values.items():
        if value is None:
            continue
        kind = "integer" if name in INTEGERS else "number"
        bad = not is_number(value) or not value > 0
        if bad or (name in INTEGERS and value != int(value)):
            raise ValueError(f"{name} must be a positive {kind}, got {value!r}")


def refuses_moved_keywords(moved: Mapping[str, str]) -> Callable:
    """A decorator: the function refuses, before any work, each keyword of ``moved`` (a keyword
    an earlier release took) with a ``TypeError`` saying where it went, ``moved[keyword]``
    (``{"target_accept": "sampler=zoo.NUTS(target_accept=...)"}``)."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            given = [k for k in kwargs if k in moved]
            if given:
                hints = "; ".join(f"{k}= goes in {moved[k]}" for k in given)
                raise TypeError(f"{function.__name__}() takes no {given[0]}=: {hints}")
            return function(*args, **kwargs)

        return wrapper

    return decorate


def check_model_factory(model_factory, where: str) -> None:
    """Refuse a model instance (or anything not callable) where ``() -> model`` is needed:
    ``where`` (``"compare"``, ``"ensemble"``) fits several models and each needs a fresh one."""

    if isinstance(model_factory, torch.nn.Module) or not callable(model_factory):
        raise TypeError(
            f"{where} takes a model factory, () -> a new model (each fit gets a fresh one), "
            f"e.g. lambda: zoo.models.BayesianMLP(...); got a {type(model_factory).__name__}"
            f"{' instance' if callable(model_factory) else ''}"
        )
