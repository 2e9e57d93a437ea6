"""The public name ``zoo.plots``: the module :mod:`zoo.evaluation.plots`, importable as
``import zoo.plots`` (and read as ``zoo.plots`` after ``import zoo``, loaded on first use)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("zoo.evaluation.plots")
