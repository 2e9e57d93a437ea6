"""The primitive checks of plain arguments, for the whole library (the families here, and
``zoo``, whose :mod:`zoo.arguments` re-exports them): an integer that is not a ``bool``, a
``bool`` that is not merely truthy, one of a few choices. Each failure is an
:class:`InvalidArgument` (a ``ValueError`` and a ``TypeError``) that names the argument, says
what was given and what is accepted. Nothing here imports torch or another module."""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

if TYPE_CHECKING:  # annotations only: nothing here imports torch
    from torch import nn

__all__ = [
    "COMMON_OPTIONS",
    "GuideStart",
    "InvalidArgument",
    "check_keywords",
    "check_family_options",
    "check_bool",
    "check_choice",
    "check_int",
    "is_int",
    "is_number",
    "physical_memory",
]


class InvalidArgument(ValueError, TypeError):
    """An argument of the wrong type or outside its range (caught as either)."""


def is_int(value) -> bool:
    """``value`` is a Python or NumPy integer and not a ``bool`` (``True`` is an ``int`` to
    Python, never a count here)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """``value`` is a real number (Python's, NumPy's) and not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value, low: int | None = None, high: int | None = None,
              meaning: str = "") -> int:  # fmt: skip
    """``value`` as an ``int``, refusing a non-integer (a ``bool``, a float, a string) and a
    value outside ``[low, high]`` with an :class:`InvalidArgument` that names ``name`` (and,
    with ``meaning``, what it counts: ``"the number of fits"``)."""
    what = f" ({meaning})" if meaning else ""
    if not is_int(value):
        raise InvalidArgument(f"{name} must be an int{what}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (
            f">= {low}" if high is None else f"<= {high}" if low is None else f"in [{low}, {high}]"
        )
        raise InvalidArgument(f"{name} must be an int {bounds}{what}, got {value!r}")
    return int(value)


def check_bool(**values) -> None:
    """Refuse a value that is not ``True`` or ``False`` (``"no"`` and ``1`` are refused, not
    read as true), naming it."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value, choices) -> None:
    """Refuse a ``value`` not among ``choices``, listing them."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value in a set of choices
        ok = False
    if not ok:
        listed = ", ".join(repr(c) for c in choices)
        raise InvalidArgument(f"{name} must be one of {listed}; got {value!r}")


def physical_memory() -> int | None:
    """The memory this process may use, in bytes: this machine's, or less where a limit says
    so (a cgroup's ``memory.max``, as in a container, or an address-space limit, ``ulimit
    -v``, less what the process maps already); ``None`` where the platform says nothing."""
    try:
        sizes = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    except (AttributeError, OSError, ValueError):
        sizes = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            sizes.append(int(text))
        break
    sizes.extend(_address_space_left())
    return min(sizes) if sizes else None


def _address_space_left() -> list[int]:
    """``[bytes]`` the address-space limit leaves this process, or ``[]`` without one."""
    if resource is None:  # not on this platform
        return []
    try:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft == resource.RLIM_INFINITY:
            return []
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return []
    return [max(soft - mapped, 0)]


class GuideStart(TypedDict, total=False):
    """The options every guide takes from :class:`PerSiteGuide` (keyword-only, each with the
    base's default): ``init_scale`` (the initial standard deviation), ``init_loc_fn`` (the
    initial means: ``"auto"``, ``"kaiming"`` or a callable), ``init_module`` (a trained
    network whose weights are the means) and ``create_plates`` (Pyro's). A composite guide
    that has options of its own takes these as ``**start: Unpack[GuideStart]`` and passes them
    on, so they are declared once."""

    init_scale: float
    init_loc_fn: str | Callable
    init_module: nn.Module | None
    create_plates: Callable | None


def check_keywords(where: str, given: Mapping, group: type) -> None:
    """Refuse keywords of ``given`` that the ``TypedDict`` ``group`` does not name, as Python
    refuses an unexpected keyword (a ``**group`` parameter would otherwise pass them on):
    ``where`` names the callable in the message."""
    names = list(group.__annotations__)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise TypeError(
            f"{where}() got unexpected keyword argument(s) {unknown}; the {group.__name__} "
            f"options it takes are {names}"
        )


#: Options every family takes (the rest are the family's own).
COMMON_OPTIONS = tuple(GuideStart.__annotations__)


def check_family_options(guide_cls: Any, site_cls: Any, options: dict) -> None:
    """Refuse options that the family's site class does not take, naming those it does."""
    if site_cls is None:
        return
    params = inspect.signature(site_cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    given = ("self", "init_loc", "init_scale", "prior")  # the guide hands a site its prior
    known = [n for n in params if n not in given]
    unknown = sorted(set(options) - set(known))
    if unknown:
        spec = inspect.signature(guide_cls.site_spec).parameters
        named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        listed = sorted({*known, *(n for n, p in spec.items() if p.kind in named)})
        own = f"its options are {listed}" if listed else "it has no options of its own"
        hint = "; Pyro's name for init_loc is init_loc_fn" if "init_loc" in unknown else ""
        raise TypeError(
            f"{guide_cls.__name__} got unknown option(s) {unknown}; {own}, and every family "
            f"takes {', '.join(COMMON_OPTIONS[:3])}{hint}"
        )
