"""The public name ``zoo.plots``: the module :mod:`zoo.evaluation.plots`, importable as
``import zoo.plots`` (and read as ``zoo.plots`` after ``import zoo``, loaded on first use)."""

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names a type checker reads
    from zoo.evaluation.plots import *  # noqa: F403

sys.modules[__name__] = importlib.import_module("zoo.evaluation.plots")
