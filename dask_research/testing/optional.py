"""Which optional dependency a module needs at import, for collecting tests and doctests.

The root ``conftest.py`` leaves out of a run the package modules whose top-level imports need
an optional dependency that is not installed (CuPy, torch, Ray, ...), instead of failing the
collection; the imports are read from the module's source, so the rule follows the code.

Examples
--------
>>> import pathlib, tempfile
>>> src = pathlib.Path(tempfile.mkdtemp()) / "mod.py"
>>> _ = src.write_text("import os\\nimport no_such_framework.sub\\ntry:\\n    import ray\\nexcept ImportError:\\n    pass\\n")
>>> sorted(top_level_imports(src))                    # a guarded import is not required
['no_such_framework', 'os']
>>> missing_dependency(src, optional={"no_such_framework", "numpy"})
'no_such_framework'
>>> installed("numpy"), installed("no_such_framework")
(True, False)
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import pathlib
from collections.abc import Iterable

__all__ = ["OPTIONAL", "installed", "top_level_imports", "missing_dependency"]

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


def missing_dependency(path: pathlib.Path, optional: Iterable[str] = OPTIONAL) -> str | None:
    """The first (by name) optional dependency module ``path`` imports and this machine lacks,
    or ``None`` when the module can be imported here."""
    absent = sorted(n for n in top_level_imports(path) & set(optional) if not installed(n))
    return absent[0] if absent else None
