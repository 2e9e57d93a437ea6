"""``python -m zoo info``: what a user and a bug report need to know about this installation.

It prints the versions of Python, the zoo, torch, torchvision, Pyro, ArviZ and each optional
extra; whether torch and torchvision work together (an operator call, not only an import); the
devices and where ``zoo.fit`` runs by default; the thread counts; the data root and whether
MNIST's files are there. Each problem is printed with what to do, and the command exits 1 when
one stops the library from working (a broken torchvision pair, a missing required package, a
``ZOO_DEVICE`` that names no usable device), 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass

import torch

import zoo
from zoo.data.sets import data_root
from zoo.runtime.devices import DEVICE_VARIABLE
from zoo.runtime.packages import installed_version, torchvision_problem
from zoo.training.recipes import resolve_device

#: Required packages (pip names) and optional extras: (pip name, extra, what it enables).
REQUIRED = ("torch", "torchvision", "pyro-ppl", "arviz", "matplotlib", "pandas", "tqdm")
EXTRAS = (
    ("lightning", "distributed", "zoo.fit(devices=..., num_nodes=...)"),
    ("laplace-torch", "laplace", "zoo.laplace, the Laplace baseline"),
    ("jupyterlab", "notebooks", "opening notebooks/"),
    ("sphinx", "docs", "building the documentation site"),
)
#: The raw files torchvision's MNIST reads from ``<root>/MNIST/raw/``.
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class Line:
    """One line of the report: ``label: text``; ``problem`` (what to do) when something is
    wrong, ``fatal`` when the library cannot work until it is fixed."""

    label: str
    text: str
    problem: str | None = None
    fatal: bool = False


def package_lines() -> list[Line]:
    """Python, the zoo, the required packages and torchvision's pair check."""

    lines = [
        Line("python", f"{platform.python_version()} ({sys.executable})"),
        Line("bnn-zoo", zoo.__version__),
    ]
    for name in REQUIRED:
        version = installed_version(name)
        if version is None:
            lines.append(
                Line(name, "not installed", f'pip install "bnn-zoo" installs {name}', True)
            )
        else:
            lines.append(Line(name, version))
    problem = torchvision_problem() if installed_version("torchvision") else None
    lines.append(
        Line("torch + torchvision", "a working pair (nms ran)", None)
        if problem is None
        else Line("torch + torchvision", "not a working pair", problem, True)
    )
    for name, extra, enables in EXTRAS:
        version = installed_version(name)
        text = version or f'not installed (pip install "bnn-zoo[{extra}]" for {enables})'
        lines.append(Line(f"{name} [{extra}]", text))
    return lines


def device_lines() -> list[Line]:
    """CUDA's devices, where ``device="auto"`` runs, and the thread counts."""

    cuda = torch.version.cuda
    lines = [Line("torch build", f"CUDA {cuda}" if cuda else "CPU only")]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(Line("CUDA devices", ", ".join(names)))
    else:
        lines.append(Line("CUDA devices", "none"))
    chosen = os.environ.get(DEVICE_VARIABLE)
    try:
        auto = resolve_device("auto")
        lines.append(
            Line(
                "zoo.fit's device",
                f"{auto} (${DEVICE_VARIABLE}={chosen!r})" if chosen else str(auto),
            )
        )
    except ValueError as err:
        lines.append(Line("zoo.fit's device", "unusable", f"{err}; unset or correct it", True))
    lines.append(
        Line(
            "threads",
            f"torch {torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} "
            f"inter-op; {os.cpu_count()} CPUs",
        )
    )
    return lines


def data_lines(root: str | None) -> list[Line]:
    """The data root, where it came from, and whether MNIST's raw files are under it."""

    where = data_root(root)
    source = "--data-root" if root else "$ZOO_DATA" if os.environ.get("ZOO_DATA") else "default"
    if where.exists() and not where.is_dir():
        return [
            Line(
                "data root",
                f"{where} ({source}) is a file, not a folder",
                "pass the folder that holds MNIST/raw (or will: zoo.data.mnist(download=True) "
                "fetches it there)",
            )
        ]
    lines = [Line("data root", f"{where} ({source})")]
    raw = where / "MNIST" / "raw"
    missing = [f for f in MNIST_FILES if not (raw / f).exists()]
    if not missing:
        lines.append(Line("MNIST", f"found in {raw}"))
    else:
        lines.append(
            Line(
                "MNIST",
                f"not in {raw} ({len(missing)} of 4 files missing)",
                "zoo.data.mnist(download=True) fetches it there, or put the four raw files "
                f"in {raw}, or point ZOO_DATA at the folder that holds MNIST/raw",
            )
        )
    return lines


def report(root: str | None = None) -> list[Line]:
    """Every line of ``python -m zoo info``."""
    return package_lines() + device_lines() + data_lines(root)


def info_command(args: argparse.Namespace) -> int:
    """Print :func:`report`; exit 1 when a problem stops the library from working."""
    lines = report(args.data_root)
    width = max(len(line.label) for line in lines)
    for line in lines:
        print(f"{line.label + ':':<{width + 2}}{line.text}")
    problems = [line for line in lines if line.problem]
    if problems:
        print("\nproblems:")
        for line in problems:
            stops = " (the library cannot work until this is fixed)" if line.fatal else ""
            print(f"- {line.label}{stops}: {line.problem}")
    return 1 if any(line.fatal for line in lines) else 0
