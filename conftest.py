"""Collection rules shared by the tests and the package's doctests.

``python -m pytest`` collects ``tests/`` and the doctests of every module of ``dask_research``
(``--doctest-modules``, setup.cfg); the ``data`` directories of the tests are never collected. A package module whose top-level imports need an optional
dependency that is not installed here (CuPy, torch, Ray, ...) is left out of the collection
(:mod:`dask_research.testing.optional` reads its imports), and the run ends by saying which
modules it left out and why; every other module's examples run.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dask_research.testing.optional import missing_dependency

PACKAGE = Path(__file__).resolve().parent / "dask_research"
TESTS = Path(__file__).resolve().parent / "tests"

_left_out: dict[str, str] = {}


def is_test_data(path: Path) -> bool:
    """Whether ``path`` lies in a ``data`` directory of the tests: files the tests read, and
    the scripts that wrote them, never tests. ``--doctest-modules`` would import such a script
    to look for examples, and one that runs a cluster at import deadlocked the collection.

    >>> is_test_data(TESTS / "montecarlo" / "data" / "make_store_v1.py"), is_test_data(TESTS / "test_cli.py")
    (True, False)
    """
    return TESTS in path.parents and "data" in path.relative_to(TESTS).parts


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    path = Path(collection_path).resolve()
    if is_test_data(path):
        return True
    if path.suffix != ".py" or PACKAGE not in path.parents:
        return None
    dependency = missing_dependency(path)
    if dependency is None:
        return None
    _left_out[str(path.relative_to(PACKAGE.parent))] = dependency
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if _left_out:
        terminalreporter.write_sep("-", "doctests not collected: optional dependency missing")
        for module, dependency in sorted(_left_out.items()):
            terminalreporter.write_line(f"{module}: needs {dependency}")
