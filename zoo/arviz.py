"""The public name ``zoo.arviz``: the module :mod:`zoo.evaluation.arviz`, importable as
``import zoo.arviz`` (and read as ``zoo.arviz`` after ``import zoo``, loaded on first use)."""

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names a type checker reads
    from zoo.evaluation.arviz import *  # noqa: F403

sys.modules[__name__] = importlib.import_module("zoo.evaluation.arviz")
