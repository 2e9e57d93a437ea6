"""The packages the zoo runs on: the tested torch/torchvision pair, the commands that install it,
and torchvision imported so that a pair that does not work together says so.

A torchvision built for another torch imports with errors such as ``operator torchvision::nms
does not exist``, which name neither package's version nor the cure. :func:`torchvision_datasets`
turns them into a :class:`BrokenTorchvisionError` that does, and :func:`torchvision_problem`
checks the pair with an operator call (what ``python -m zoo info`` reports).
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

import torch

__all__ = [
    "CPU_INSTALL",
    "GPU_INSTALL",
    "TESTED_PAIR",
    "BrokenTorchvisionError",
    "installed_version",
    "torchvision_datasets",
    "torchvision_problem",
]

#: The torch and torchvision releases the suite runs on (inside ``pyproject.toml``'s bounds).
TESTED_PAIR = ("2.14.1", "0.29.1")
#: PyTorch's CPU build of the tested pair from PyTorch's own wheel index (no NVIDIA libraries);
#: install the project after it and pip keeps the pair.
CPU_INSTALL = (
    f'pip install "torch=={TESTED_PAIR[0]}" "torchvision=={TESTED_PAIR[1]}" '
    "--index-url https://download.pytorch.org/whl/cpu"
)
#: The same pair with CUDA (the default build on Linux).
GPU_INSTALL = f'pip install "torch=={TESTED_PAIR[0]}" "torchvision=={TESTED_PAIR[1]}"'


class BrokenTorchvisionError(ImportError):
    """torchvision is missing, or installed for another torch than the one imported."""


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a pip name), or None when it is not
    installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int]:
    """``"2.14.1+cpu"`` -> ``(2, 14)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def pair_mismatch(torch_version: str, torchvision_version: str) -> str | None:
    """Why two releases are not a pair, or None: torchvision ``0.N`` is built for torch
    ``2.(N - 15)`` (0.26 for 2.11, 0.29 for 2.14)."""
    (t_major, t_minor), (v_major, v_minor) = _release(torch_version), _release(torchvision_version)
    if t_major == 2 and v_major == 0 and v_minor - 15 != t_minor:
        return (
            f"torchvision {torchvision_version} is built for torch 2.{v_minor - 15}, and torch "
            f"{torch_version} is installed"
        )
    return None


def _advice() -> str:
    return (
        "install a matching pair, without a GPU: "
        + CPU_INSTALL
        + " ; with one: "
        + GPU_INSTALL
        + " ; then `python -m zoo info` checks it"
    )


def torchvision_problem() -> str | None:
    """What is wrong with the installed torchvision, or None when it imports, is the pair of the
    imported torch and runs one of its operators (``torchvision.ops.nms`` on two boxes)."""

    try:
        import torchvision
        from torchvision.ops import nms

        kept = nms(torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2), torch.tensor([0.9, 0.8]), 0.5)
    except ImportError as err:
        if installed_version("torchvision") is None:
            return f"torchvision is not installed; {_advice()}"
        return f"torchvision does not import ({err}); {_advice()}"
    except RuntimeError as err:  # its compiled operators do not fit this torch
        vision = installed_version("torchvision") or "?"
        return (
            f"torchvision {vision} does not work with torch {torch.__version__} ({err}); "
            f"{_advice()}"
        )
    if kept.tolist() != [0]:
        return f"torchvision's nms gave {kept.tolist()} for two equal boxes, not [0]; {_advice()}"
    mismatch = pair_mismatch(torch.__version__, torchvision.__version__)
    return f"{mismatch}; {_advice()}" if mismatch else None


@functools.cache
def _torchvision_problem_once() -> str | None:
    return torchvision_problem()


def require_torchvision(purpose: str) -> None:
    """Raise :class:`BrokenTorchvisionError` (what is wrong, both versions, the commands that
    install a working pair) when torchvision does not work with the imported torch, before
    ``purpose`` (laplace-torch, Lightning) imports it and fails with torchvision's raw
    ``operator torchvision::nms does not exist``. The check runs once per process."""
    problem = _torchvision_problem_once()
    if problem is not None:
        raise BrokenTorchvisionError(f"{purpose} imports torchvision, and {problem}")


def torchvision_datasets():
    """``torchvision.datasets``, or a :class:`BrokenTorchvisionError` naming both versions and
    the commands that install a working pair."""
    try:
        import torchvision.datasets as datasets
    except (ImportError, RuntimeError) as err:
        vision = installed_version("torchvision")
        what = (
            "torchvision is not installed"
            if vision is None
            else f"torchvision {vision} does not work with torch {torch.__version__} ({err})"
        )
        raise BrokenTorchvisionError(f"{what}; {_advice()}") from err
    return datasets
