"""The public name ``zoo.arviz``: the module :mod:`zoo.evaluation.arviz`, importable as
``import zoo.arviz`` (and read as ``zoo.arviz`` after ``import zoo``, loaded on first use)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("zoo.evaluation.arviz")
