"""The command line's argument values: ``--noise``, ``--prior`` and ``KEY=VALUE`` options (the
option groups' fields parse theirs in :mod:`zoo.training.option_values`)."""

from __future__ import annotations

import argparse
import math

from zoo import priors
from zoo.training.option_values import positive_int


def prior_value(text: str):
    """``--prior``: ``default``, ``learned``, ``hierarchical``, ``normal:S`` (``N(0, S^2)``) or
    ``layerwise:G`` (``N(0, G^2 / fan_in)``)."""

    if text in ("default", "learned", "hierarchical"):
        return None if text == "default" else text
    kind, _, number = text.partition(":")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if kind in ("normal", "layerwise") and 0 < value < math.inf:
        return priors.NormalPrior(value) if kind == "normal" else priors.LayerwiseNormalPrior(value)
    raise argparse.ArgumentTypeError(
        "expected default, learned, hierarchical, normal:S (N(0, S^2) on every weight) or "
        f"layerwise:G (N(0, G^2 / fan_in)) with a positive number, got {text!r}"
    )


def steps_value(text: str) -> int | str:
    """``--num-steps``: a whole number of at least 1, or ``auto`` (stop on convergence,
    :mod:`zoo.training.convergence`)."""
    return "auto" if text == "auto" else positive_int(text)


def noise_value(text: str) -> float | str:
    """``--noise``: a positive standard deviation, ``learned`` or ``heteroscedastic``."""
    if text in ("learned", "heteroscedastic"):
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            "expected a positive number (the noise standard deviation), 'learned' or "
            f"'heteroscedastic', got {text!r}"
        )
    return value


def parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def guide_options(pairs: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs as a dict (numbers, true/false and none parsed)."""
    options = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"--guide-option takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        options[key] = parse_value(value)
    return options


def family_options(pairs: list[str] | None, families: list[str]) -> dict[str, dict]:
    """``compare``'s ``FAMILY.KEY=VALUE`` pairs as ``{family: options}``."""
    out: dict[str, dict] = {family: {} for family in families}
    for pair in pairs or []:
        family, _, rest = pair.partition(".")
        if family not in out or "=" not in rest:
            raise ValueError(
                f"compare's --guide-option takes FAMILY.KEY=VALUE for one of the compared "
                f"families {families}, got {pair!r} (e.g. lowrank.rank=5)"
            )
        out[family].update(guide_options([rest]))
    return out
