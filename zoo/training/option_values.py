"""Option fields written as text (a command-line flag's value): each parser returns the field's
value or raises ``argparse.ArgumentTypeError`` saying what it expected. The option groups
(:mod:`zoo.training.options`) declare them as their flags' types; the command line reads
them from there."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A whole number of at least 1 (``--epochs``, ``--batch-size``, ``--steps``, ...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (``--lr``, ``--kl-weight``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def rate_value(text: str) -> float | str:
    """``--lr``: ``auto`` (measured by the rate test, refused on a fit too short) or a positive
    number."""
    return "auto" if text == "auto" else positive_float(text)


def steps_between_value(value: str):
    """``--check-every``: ``auto`` or a positive count."""
    return value if value == "auto" else positive_int(value)


def jit_value(value: str):
    """``--jit``, ``--map-start``: ``auto``, ``true`` or ``false``."""
    choices = {"auto": "auto", "true": True, "false": False}
    if value.lower() not in choices:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {value!r}")
    return choices[value.lower()]


def devices_value(value: str):
    """``--devices``: a count of at least 1, ``-1`` (all) or ``auto``."""
    if value in ("auto", "-1"):
        return -1 if value == "-1" else value
    return positive_int(value)


def threads_value(value: str):
    """``--threads``: ``auto`` or a positive count."""
    return value if value == "auto" else positive_int(value)
