"""Checks of a model before any work: that it is a Pyro model a fit can take
(:func:`check_model`), and a network's layer sizes before any weight is allocated: each size a
whole number of at least 1, and the whole within this machine's memory (a width of ``10**6``
reached the allocator, which asked for terabytes)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch
from pyro.infer.autoguide import AutoGuide
from pyro.nn import PyroModule

from guides.checks import physical_memory
from zoo.arguments import is_int
from zoo.models.base import BayesianModel

__all__ = ["BYTES_PER_WEIGHT", "check_memory", "check_model", "check_sizes"]

#: Bytes a fit holds per weight, at least: the network's float32 weight, the draw of the
#: guide's set-up trace, and the least family's share (a point mass with its gradient and
#: Adam's state, :data:`guides.memory.BYTES_PER_PARAMETER`, and its step's 12,
#: :meth:`guides.site.SitePosterior.step_bytes`).
BYTES_PER_WEIGHT = 4 + 4 + 20 + 12


def check_sizes(name: str, sizes: Sequence, weights: int | None = None) -> None:
    """Refuse sizes (``name`` says which argument) that are not whole numbers >= 1, and a
    network of ``weights`` weights (default: a chain of linear layers through ``sizes``) that
    would not fit in this machine's memory at :data:`BYTES_PER_WEIGHT` bytes a weight."""
    for size in sizes:
        if not is_int(size) or size < 1:
            raise ValueError(f"{name} must be whole numbers of at least 1, got {list(sizes)}")
    if weights is None:
        weights = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
    check_memory(weights, f"{name} {list(sizes)} make a network of", "use smaller layers")


def check_memory(weights: int, what: str, advice: str) -> None:
    """Refuse ``weights`` weights in sample sites that cannot be fitted in this machine's
    memory at :data:`BYTES_PER_WEIGHT` bytes a weight: ``"{what} {weights} weights, which
    needs at least ... GiB ...; {advice}"``."""
    memory = physical_memory()  # the machine's, or a container's or address-space limit
    if memory is not None and weights * BYTES_PER_WEIGHT > memory:
        raise ValueError(
            f"{what} {weights:.3g} weights, which needs at least "
            f"{weights * BYTES_PER_WEIGHT / 2**30:,.1f} GiB to fit ({BYTES_PER_WEIGHT} bytes a "
            f"weight) where this machine has {memory / 2**30:,.1f} GiB; {advice}"
        )


def check_model(model, guide=None) -> None:
    """Refuse what cannot be a Pyro model of ``zoo.fit``: nothing, a non-callable, or a plain
    torch module (no sample site: convert it); and a guide instance built for another model."""

    if model is None or not callable(model):
        raise TypeError(
            f"model must be a Pyro model (a zoo.models network, or a callable model(x, y) with "
            f"a sample site per weight), got {type(model).__name__}"
        )
    plain = isinstance(model, torch.nn.Module) and not isinstance(
        model, (BayesianModel, PyroModule)
    )
    if plain and not _takes_two_arguments(model.forward):
        raise TypeError(
            f"model is a plain torch module ({type(model).__name__}) with no sample sites: "
            "convert it to a Bayesian model first, zoo.models.from_module(net, "
            "task='regression' or 'classification')"
        )
    if isinstance(guide, AutoGuide):
        built_for = _unwrapped(getattr(guide, "_model", (None,))[0])
        if isinstance(built_for, torch.nn.Module) and built_for is not model:
            raise ValueError(
                f"the guide was built for another model ({type(built_for).__name__} object at "
                f"{id(built_for):#x}), not the one given to fit; build it for this model "
                "(guides.get(name)(model)) or pass the family's name"
            )


def _unwrapped(program, depth: int = 4):
    """The module a guide's model is, under Pyro's handler wrappers (partials whose last
    argument is the program they wrap); ``program`` itself when it is not one."""

    for _ in range(depth):
        if not isinstance(program, functools.partial) or not program.args:
            break
        program = program.args[-1]
    return program


def _takes_two_arguments(function: Callable) -> bool:

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None, None)
    except TypeError:
        return False
    return True
