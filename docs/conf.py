"""Sphinx configuration for dask-research."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import dask_research  # noqa: E402

project = "dask-research"
author = "dask-research developers"
# Without it alabaster's footer reads "©." (the year: the project's first release).
copyright = f"2026, {author}"
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
# Links into the Python, NumPy, Dask and PyTorch docs need their inventories from the network;
# CI builds offline (and with -W), so they are on only when DASK_RESEARCH_DOCS_ONLINE=1.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "numpy": ("https://numpy.org/doc/stable", None),
    "dask": ("https://docs.dask.org/en/stable", None),
    "distributed": ("https://distributed.dask.org/en/stable", None),
    "torch": ("https://pytorch.org/docs/stable", None),
} if os.environ.get("DASK_RESEARCH_DOCS_ONLINE") == "1" else {}
intersphinx_timeout = 5
templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
# Wide enough for a 79-column code block and the result's printed lines without a scrollbar.
html_theme_options = {"page_width": "1100px", "sidebar_width": "220px"}
html_static_path = ["_static"]


def _write_config_reference(app) -> None:
    """Generate configuration-reference.rst from research-schema.yaml and research.yaml."""
    import yaml

    root = os.path.join(os.path.dirname(__file__), "..", "dask_research")
    with open(os.path.join(root, "research-schema.yaml")) as f:
        schema = yaml.safe_load(f)["properties"]["research"]["properties"]
    with open(os.path.join(root, "research.yaml")) as f:
        defaults = yaml.safe_load(f)["research"]
    lines = ["Configuration reference", "=======================", "",
             "Generated from ``research-schema.yaml`` and ``research.yaml`` when the docs are built.",
             "Set any key with ``dask.config.set({'research.<section>.<key>': value})``, a YAML file in",
             "``~/.config/dask/`` or an environment variable ``DASK_RESEARCH__<SECTION>__<KEY>``.", ""]
    for section, body in schema.items():
        title = f"``research.{section}``"
        lines += [title, "-" * len(title), "", body.get("description", ""), "",
                  ".. list-table::", "   :header-rows: 1", "   :widths: 25 15 15 45", "",
                  "   * - key", "     - type", "     - default", "     - meaning"]
        for key, spec in body.get("properties", {}).items():
            typ = spec.get("type")
            typ = " or ".join(typ) if isinstance(typ, list) else typ
            default = defaults.get(section, {}).get(key)
            lines += [f"   * - ``{key}``", f"     - {typ}", f"     - ``{default!r}``",
                      f"     - {spec.get('description', '')}"]
        lines.append("")
    path = os.path.join(os.path.dirname(__file__), "configuration-reference.rst")
    text = "\n".join(lines) + "\n"
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def setup(app):
    app.connect("builder-inited", _write_config_reference)
