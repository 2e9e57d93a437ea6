"""Sphinx configuration of the documentation site: ``python -m sphinx -W -b html docs docs/_build``.

The API reference is generated from the NumPy docstrings (autodoc, napoleon, autosummary); the
notebooks are rendered from their saved outputs (myst-nb, never executed here).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402

project = "bnn-zoo"
author = "the bnn-zoo authors"
release = zoo.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_templates", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_class_signature = "mixed"  # the constructor's parameters with the class, documented once
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # Lightning's and torch's own docs are theirs
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

nb_execution_mode = "off"  # the notebooks' saved outputs, as the repository holds them
myst_enable_extensions = ["dollarmath", "colon_fence"]
suppress_warnings = ["mystnb.unknown_mime_type"]

html_theme = "pydata_sphinx_theme"
html_title = "bnn-zoo"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 5,
    "external_links": [
        {"name": "PyTorch", "url": "https://pytorch.org/docs/stable/"},
        {"name": "Pyro", "url": "https://docs.pyro.ai/en/stable/"},
        {"name": "ArviZ", "url": "https://python.arviz.org/en/stable/"},
    ],
}
html_static_path = []
