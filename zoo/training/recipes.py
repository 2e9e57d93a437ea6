"""How long and how fast a fit runs when the caller does not say.

``zoo.fit``'s length (``epochs``, ``num_steps``), ``batch_size``, ``lr`` and ``lr_schedule``
default to ``None``, resolved here from the data size alone, before any training:

- **Small regression data** (a model whose ``task`` is ``"regression"``, at most
  :data:`SMALL_DATA` examples) with neither ``epochs`` nor ``num_steps`` given gets the
  full-batch recipe :data:`REGRESSION_FIT`: every example in one batch (unless ``batch_size``
  is given; a ``DataLoader`` keeps its own batches), 3,000 Adam steps at ``lr`` 1e-2 decaying
  tenfold (each unless given). One epoch of such data is one or two steps, which learn nothing.
- **Otherwise** one epoch at batch 128 (each unless given) and, when neither ``lr`` nor
  ``lr_schedule`` is given, Adam at :data:`DEFAULT_LR` (3e-3) decaying tenfold over the run
  (:data:`DEFAULT_SCHEDULE`).

The minibatch default rate is the centre of the learning-rate range test that measures the
rate of a fit long enough for it (:mod:`zoo.training.rate`; :attr:`Length.measure`), and the
rate that runs where none is measured. Small regression data keep the full-batch recipe's
own rate (1e-2 decaying tenfold, times the family's scale), measured for them across the
families (``benchmarks/fairness.py`` at ``cc5a66b``), whatever the length (a given ``epochs`` or
``num_steps`` replaces the recipe's length, not its rate): there the range test's faster
rates over-fit a point estimate (MAP, Laplace's MAP fit, an ensemble's members; the
measurements are in ``benchmarks/README.md`` at ``91a332b``) and gained the variational families
little;
``lr="auto"`` measures it all the same. A given ``lr`` runs constant unless ``lr_schedule`` is
given too; a given ``lr_schedule`` multiplies 3e-3. A fit whose length a convergence rule decides
(``num_steps="auto"``) runs at the constant :data:`CONVERGENCE_LR` (1e-3), unmeasured: a rule
that stops when the ELBO settles needs a rate it can settle at. When the length came from the
defaults and is under :data:`MIN_DEFAULT_STEPS` optimiser steps, ``fit`` warns and says what to
pass.

``benchmarks/fairness.py`` at ``cc5a66b`` measures the default call against a grid of rates on
short and long budgets (``benchmarks/README.md`` at ``91a332b``).

A fit that starts at a trained network's weights (:func:`starts_trained`: a converted network,
``zoo.models.from_module``'s ``init="module"``, or a guide given ``init_module``) runs each
default rate times :data:`TRAINED_LR_FACTOR` (1/30: 3e-3 becomes 1e-4): a fine-tune at the
rate of a fresh start leaves the trained minimum, even a point estimate's; the factor is chosen
by ``benchmarks/trained_network.py``.

Either default rate is multiplied by the family's ``lr_scale`` (its
:class:`guides.registry.Recipe`, declared on its class as ``RECIPE``; the full-batch recipe's
by its ``full_batch_lr_scale`` where the family declares one) when ``lr`` is not given;
``result.options["lr"]`` is the rate that ran.

``device="auto"`` is CUDA when there is one, else the CPU (:func:`resolve_device`).

``result.options["recipe"]`` says which applied (``"small regression data"``,
``"default"``, or ``"given"`` when the caller set the length; ``", trained start"`` added
when :data:`TRAINED_LR_FACTOR` applied, ``", rate measured"`` when the rate test ran), and
``result.options["lr_rule"]`` what chose the rate (:attr:`Length.lr_rule`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from guides.registry import Family, Recipe, get
from zoo.data.forms import size as data_size
from zoo.runtime.devices import DEVICE_VARIABLE, chosen_device

__all__ = [
    "CONVERGENCE_LR",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LR",
    "DEFAULT_SCHEDULE",
    "TRAINED_LR_FACTOR",
    "MIN_DEFAULT_STEPS",
    "PLAIN_RECIPE",
    "REGRESSION_FIT",
    "SMALL_DATA",
    "Length",
    "ShortFitWarning",
    "data_size",
    "resolve_device",
    "resolve_length",
    "warn_if_short",
]

#: Data sets of at most this many examples get the full-batch recipe by default.
SMALL_DATA = 2048
#: The full-batch recipe for small data sets (the demo's): Adam at ``lr`` 1e-2 decaying tenfold
#: over 3,000 steps; ``benchmarks/regression.py`` fits with it unless told otherwise.
REGRESSION_FIT: dict = {"num_steps": 3000, "lr": 1e-2, "lr_schedule": "exponential"}
#: ``Length.lr_rule`` where small regression data keep the full-batch recipe's rate.
RECIPE_RULE = "default (small regression data's recipe)"
#: The minibatch of every other fit, unless given.
DEFAULT_BATCH_SIZE = 128
#: The learning rate of every other fit when neither ``lr`` nor ``lr_schedule`` is given, and
#: its schedule (``zoo.Optim.lr_schedule``'s ``"exponential"``: ``0.1 ** (step / total)``).
DEFAULT_LR = 3e-3
#: The factor of every default rate for a fit that starts at a trained network's weights.
TRAINED_LR_FACTOR = 1 / 30
DEFAULT_SCHEDULE = "exponential"
#: The constant rate of a minibatch fit whose length a convergence rule decides.
CONVERGENCE_LR = 1e-3
#: The recipe of a family that declares none: the task's rates as they are.
PLAIN_RECIPE = Recipe()
#: A fit whose default length is fewer optimiser steps than this warns.
MIN_DEFAULT_STEPS = 200


class ShortFitWarning(UserWarning):
    """A fit's default length gives it too few optimiser steps to learn much."""


@dataclass(frozen=True)
class Length:
    """A fit's resolved length and rate: ``num_steps`` is None when ``epochs`` decides."""

    epochs: int
    num_steps: int | None
    batch_size: int
    lr: float
    lr_schedule: str | Callable[[int], float] | None
    recipe: str
    #: How the rate is found: ``None`` (``lr`` as it is), ``"default"`` (measured by the rate
    #: test where the fit is long enough, else ``lr``) or ``"required"`` (``lr="auto"``: measured,
    #: or refused when the fit is too short); ``lr`` is then the test's centre.
    measure: str | None = None
    #: What chose ``lr`` (``result.options["lr_rule"]``): ``"given"``, ``"range test"`` (set
    #: after the test ran) or ``"default"`` with why it was not measured.
    lr_rule: str = "given"


def resolve_length(
    data,
    model=None,
    *,
    epochs: int | None,
    num_steps: int | None,
    batch_size: int | None,
    lr: float | str | None,
    lr_schedule,
    auto: bool = False,
    recipe: Recipe = PLAIN_RECIPE,
    trained: bool = False,
) -> Length:
    """The length, batch size, learning rate and schedule of a fit on ``data`` (see the module
    docstring); given values are kept as they are. ``auto``: ``num_steps`` is the cap of a
    convergence rule (:mod:`zoo.training.convergence`), so small regression data keeps the
    full-batch recipe's batch and rate, at a constant rate unless ``lr_schedule`` is given (a
    schedule over the cap would still be high where the rule stops). ``recipe``: the
    family's (:class:`guides.registry.Recipe`), whose :meth:`~guides.registry.Recipe.scale`
    multiplies the default rate when ``lr`` is not given. ``trained``: the fit starts at a
    trained network's weights (:func:`starts_trained`), and a default rate is multiplied by
    :data:`TRAINED_LR_FACTOR`."""
    measure, rule = _rate_rule(lr, auto, trained)
    if isinstance(lr, str):  # "auto" (fit checks the value): measured around the default
        lr = None
    factor, start = (TRAINED_LR_FACTOR, ", trained start") if trained and lr is None else (1, "")
    n = data_size(data)
    loader = isinstance(data, DataLoader)  # its batch size is its own
    small = n is not None and 0 < n <= SMALL_DATA and getattr(model, "task", "") == "regression"
    if epochs is None and (num_steps is None or auto) and small and n is not None:
        default_schedule = None if auto else REGRESSION_FIT["lr_schedule"]
        if measure == "default":  # the recipe's own rate (see the module docstring)
            measure, rule = None, RECIPE_RULE
        return Length(
            epochs=1,
            num_steps=num_steps if auto else REGRESSION_FIT["num_steps"],
            batch_size=batch_size
            if batch_size is not None
            else (DEFAULT_BATCH_SIZE if loader else n),
            lr=lr if lr is not None else _recipe_lr(recipe, True, factor),
            lr_schedule=lr_schedule if lr_schedule is not None else default_schedule,
            recipe="small regression data" + (", length auto" if auto else "") + start,
            measure=measure,
            lr_rule=rule,
        )
    kind = "default" if epochs is None and num_steps is None else "given"
    batch_size = batch_size if batch_size is not None else DEFAULT_BATCH_SIZE
    if lr is None and auto:
        lr = CONVERGENCE_LR * recipe.scale(full_batch=False) * factor
    elif lr is None and small and measure == "default":  # a given length, the recipe's rate
        lr = _recipe_lr(recipe, n is not None and batch_size >= n and not loader, factor)
        lr_schedule = lr_schedule if lr_schedule is not None else REGRESSION_FIT["lr_schedule"]
        measure, rule = None, RECIPE_RULE
    elif lr is None:
        lr = DEFAULT_LR * recipe.scale(full_batch=False) * factor
        lr_schedule = lr_schedule if lr_schedule is not None else DEFAULT_SCHEDULE
    return Length(
        epochs=epochs if epochs is not None else 1,
        num_steps=num_steps,
        batch_size=batch_size,
        lr=lr,
        lr_schedule=lr_schedule,
        recipe=kind + start,
        measure=measure,
        lr_rule=rule,
    )


def _recipe_lr(recipe: Recipe, full_batch: bool, factor: float) -> float:
    """The full-batch recipe's rate times the family's scale for full or minibatches."""
    return float(REGRESSION_FIT["lr"]) * recipe.scale(full_batch=full_batch) * factor


def _rate_rule(lr, auto: bool, trained: bool) -> tuple[str | None, str]:
    """``(Length.measure, Length.lr_rule)`` of a fit given ``lr``, before a rate test (which sets
    the rule to ``"range test"`` when it runs): ``lr="auto"`` requires the test; no ``lr``
    measures it by default, except under a convergence rule (its constant rate settles) and
    from a trained start (a fine-tune's rate is :data:`TRAINED_LR_FACTOR`'s, measured by
    ``benchmarks/trained_network.py``: a sweep from a minimum finds the rate that leaves it)."""
    if lr == "auto":
        return "required", "default (fit too short to measure)"
    if lr is not None:
        return None, "given"
    if auto:
        return None, "default (a convergence rule's constant rate)"
    if trained:
        return None, "default (trained start)"
    return "default", "default (fit too short to measure)"


def starts_trained(model, guide) -> bool:
    """Whether a fit of ``guide`` (as ``zoo.fit`` takes it) on ``model`` starts at a trained
    network's weights: the model offers them (``model.offers_weights``: a converted
    network given ``init="module"`` or taken for a trained one, :mod:`zoo.training.start`)
    and the family takes them (``init_loc_fn`` left at ``"auto"``, and not a family
    that cannot start at given weights, ``STARTS_AT_WEIGHTS = False``: WHVI), or a guide is
    given ``init_module``. A guide factory of the user's cannot be asked: ``False``."""
    offered = getattr(model, "offers_weights", False)
    if isinstance(guide, Family):
        if "init_module" in guide.options:
            return True
        auto = guide.options.get("init_loc_fn", "auto") == "auto"
        return offered and auto and getattr(guide.cls, "STARTS_AT_WEIGHTS", False)
    if isinstance(guide, str):
        return offered and getattr(get(guide), "STARTS_AT_WEIGHTS", False)
    if isinstance(guide, type):
        return offered and getattr(guide, "STARTS_AT_WEIGHTS", False)
    if isinstance(guide, torch.nn.Module):  # an instance
        if getattr(guide, "_init_values", None):
            return True
        auto = getattr(guide, "init_loc_fn", None) == "auto"
        return offered and auto and getattr(guide, "STARTS_AT_WEIGHTS", False)
    return False


def warn_if_short(recipe: str, steps: int, n: int, batch_size: int) -> None:
    """Warn when the default length (``recipe == "default"``) is under
    :data:`MIN_DEFAULT_STEPS` optimiser steps, saying what to pass."""
    if recipe != "default" or steps >= MIN_DEFAULT_STEPS:
        return
    epochs = math.ceil(MIN_DEFAULT_STEPS * 10 / max(steps, 1))
    warnings.warn(
        f"this fit takes {steps} optimiser step(s) (the default: one epoch of {n} examples in "
        f"batches of {batch_size}), too few to learn much; pass num_steps= (e.g. "
        f"num_steps={MIN_DEFAULT_STEPS * 10}) or epochs= (e.g. epochs={epochs})",
        ShortFitWarning,
        stacklevel=4,
    )


def resolve_device(device) -> torch.device:
    """``"auto"`` -> the device ``$ZOO_DEVICE`` names when it is set, else CUDA when available,
    else the CPU; anything else as ``torch.device``."""
    if device == "auto":
        chosen = chosen_device()
        if chosen is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return resolve_device(torch.device(chosen))
        except (RuntimeError, ValueError) as err:
            raise ValueError(
                f"${DEVICE_VARIABLE}={chosen!r} is not a usable device: {err}"
            ) from None
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r}, but this machine has no usable CUDA device (torch "
            f"{torch.__version__} sees none); use device='auto' or 'cpu'"
        )
    return device
