"""Which optional dependency a module needs at import, for collecting tests and doctests.

The root ``conftest.py`` leaves out of a run the package modules whose top-level imports, or
whose docstring examples' imports, need an optional dependency that is not installed (CuPy,
torch, Ray, ...), instead of failing; the imports are read from the module's source, so the
rule follows the code.

Examples
--------
>>> import pathlib, tempfile
>>> src = pathlib.Path(tempfile.mkdtemp()) / "mod.py"
>>> _ = src.write_text("import os\\nimport no_such_framework.sub\\ntry:\\n    import ray\\nexcept ImportError:\\n    pass\\n")
>>> sorted(top_level_imports(src))                    # a guarded import is not required
['no_such_framework', 'os']
>>> missing_dependency(src, optional={"no_such_framework", "numpy"})
'no_such_framework'
>>> _ = src.write_text("'''Examples\\n\\n>>> import other_framework\\n'''\\n")
>>> sorted(example_imports(src))                      # what the module's examples need
['other_framework']
>>> installed("numpy"), installed("no_such_framework")
(True, False)
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import pathlib
import re
from collections.abc import Iterable

__all__ = ["OPTIONAL", "installed", "top_level_imports", "example_imports", "missing_dependency"]

#: Import names of the dependencies outside ``install_requires`` (setup.cfg's extras).
OPTIONAL = frozenset({
    "bokeh", "cupy", "dask_jobqueue", "gymnasium", "hypothesis", "mabwiser", "optuna", "ray",
    "scipy", "selenium", "stable_baselines3", "tensordict", "torch", "torchrl",
})


@functools.cache
def installed(name: str) -> bool:
    """Whether top-level package ``name`` can be imported here (it is not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def top_level_imports(path: pathlib.Path) -> set[str]:
    """Top-level packages a module imports as it is imported: its unguarded module-level
    ``import``/``from`` statements (not those under ``try:`` or ``if``, nor relative ones)."""
    names: set[str] = set()
    for node in ast.parse(pathlib.Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


_EXAMPLE_IMPORT = re.compile(r"^\s*>>>\s+(?:import|from)\s+([A-Za-z_]\w*)", re.MULTILINE)


def example_imports(path: pathlib.Path) -> set[str]:
    """Top-level packages the docstring examples of a module import (``>>> import x``,
    ``>>> from x import ...``): what its doctests need besides the module itself."""
    tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(_EXAMPLE_IMPORT.findall(ast.get_docstring(node, clean=False) or ""))
    return names


def missing_dependency(path: pathlib.Path, optional: Iterable[str] = OPTIONAL) -> str | None:
    """The first (by name) optional dependency that module ``path`` or its docstring examples
    import and this machine lacks, or ``None`` when its doctests can run here."""
    needed = top_level_imports(path) | example_imports(path)
    absent = sorted(n for n in needed & set(optional) if not installed(n))
    return absent[0] if absent else None
