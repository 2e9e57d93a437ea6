"""The checks of the option groups' fields that need more than a type (:mod:`zoo.training.options`
calls them from each group's ``__post_init__``): each refuses a value that cannot be right
when the group is built, before any fit starts."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from zoo.arguments import InvalidArgument, check_factor, is_int, is_number
from zoo.training.optim import SCHEDULES

__all__ = [
    "check_callbacks",
    "check_device",
    "check_devices",
    "check_kl_weight",
    "check_multipliers",
    "check_optimizer_options",
    "check_run",
    "check_schedule",
]


def _absent(value, name: str, what: str) -> bool:
    """Whether the optional mapping option ``name`` is absent (``None``); a ``TypeError``
    saying it must be ``what`` when it is neither ``None`` nor a mapping."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    return value is None


def check_optimizer_options(options) -> None:
    if _absent(options, "optimizer_options", "a dict of the optimiser's arguments"):
        return
    taken = {"lr": "pass lr= to zoo.fit", "params": "the fit passes the guide's parameters"}
    for key, why in taken.items():
        if key in options:
            raise ValueError(f"optimizer_options must not hold {key!r}: {why}")


def check_multipliers(multipliers) -> None:
    if _absent(multipliers, "lr_multipliers", "a dict pattern -> factor"):
        return
    for pattern, factor in multipliers.items():
        number = is_number(factor)
        if not isinstance(pattern, str) or not number or not math.isfinite(factor) or factor < 0:
            raise ValueError(
                f"lr_multipliers[{pattern!r}] = {factor!r}: each pattern is a string and each "
                "factor a finite number >= 0 (a negative factor climbs the loss; 0 freezes)"
            )


def check_device(device) -> None:
    if device == "auto" or isinstance(device, torch.device) and device.type in ("cpu", "cuda"):
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (or a torch.device of those), "
            f"got {device!r}"
        )


def check_devices(devices) -> None:
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto" or text == "-1" or all(p.strip().isdigit() for p in text.split(",")):
            if text not in ("0", ""):
                return
    elif is_int(devices):
        if devices >= 1 or devices == -1:
            return
    elif isinstance(devices, (list, tuple)) and devices:
        if all(is_int(d) and d >= 0 for d in devices):
            return
    raise ValueError(
        f"devices must be a count >= 1, -1 (all), 'auto', or device indices such as [0, 1] "
        f"(as Lightning's), got {devices!r}"
    )


def check_run(run) -> None:
    """What :class:`zoo.Run`'s fields must hold together."""
    if run.checkpoint_every is not None and run.checkpoint is None:
        raise ValueError(
            f"checkpoint_every={run.checkpoint_every} needs checkpoint= (the file to write); "
            "pass both, or neither"
        )
    check_callbacks(run.callbacks)
    if run.progress not in (True, False):
        raise TypeError(f"progress must be True or False, got {run.progress!r}")


def check_callbacks(callbacks) -> None:
    if callable(callbacks) or isinstance(callbacks, (str, bytes)):
        raise TypeError("callbacks must be a list of callables: pass callbacks=[f]")
    try:
        listed = list(callbacks)
    except TypeError:
        raise TypeError(
            f"callbacks must be a list of callables, got {type(callbacks).__name__}"
        ) from None
    for cb in listed:
        if not callable(cb):
            raise TypeError(f"each callback must be callable, got {cb!r}")


def check_schedule(schedule) -> None:
    if schedule is None or callable(schedule):
        return

    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(
            f"lr_schedule must be a callable step -> factor or one of {sorted(SCHEDULES)}, "
            f"got {schedule!r}"
        )


def check_kl_weight(weight) -> None:
    if callable(weight):
        check_factor("kl_weight", weight)
    elif not is_number(weight) or not weight >= 0:
        raise ValueError(f"kl_weight must be a number >= 0 or step -> number, got {weight!r}")
    elif not math.isfinite(weight):
        raise ValueError(f"kl_weight must be finite, got {weight!r}")


def check_map_start(value) -> None:
    """``zoo.Loss(map_start=...)``: ``"auto"``, ``True`` or ``False``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise InvalidArgument(f"map_start must be 'auto', True or False; got {value!r}")
