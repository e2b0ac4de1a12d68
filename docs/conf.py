"""Sphinx configuration for dask-research."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import dask_research  # noqa: E402

project = "dask-research"
author = "dask-research developers"
release = dask_research.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "numpydoc",
]
autosummary_generate = True
numpydoc_show_class_members = False
autodoc_typehints = "none"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "numpy": ("https://numpy.org/doc/stable", None),
    "dask": ("https://docs.dask.org/en/stable", None),
    "distributed": ("https://distributed.dask.org/en/stable", None),
    "torch": ("https://pytorch.org/docs/stable", None),
}
# Offline builds (CI has no network): intersphinx inventories are optional.
intersphinx_timeout = 2
templates_path = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
