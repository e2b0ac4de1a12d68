"""Collection rules shared by the tests and the package's doctests.

``python -m pytest`` collects ``tests/`` and the doctests of every module of ``dask_research``
(``--doctest-modules``, setup.cfg); the ``data`` directories of the tests are never collected.
A package module whose top-level imports need an optional dependency that is not installed
here (CuPy, torch, Ray, ...) is left out of the collection (:mod:`dask_research.testing.optional`
reads its imports), and the run ends by saying which modules it left out and why; every other
module's examples run. A collection that takes longer than :data:`COLLECTION_LIMIT` seconds
ends the run with every thread's stack.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
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


#: Seconds the collection may take before the run ends loudly (``DASK_RESEARCH_COLLECTION_LIMIT``
#: overrides it): pytest-timeout guards each test, not the collection, where a module that
#: blocks at import would hang the run for good.
COLLECTION_LIMIT = float(os.environ.get("DASK_RESEARCH_COLLECTION_LIMIT", 900))


_collection_timer: threading.Timer | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _collection_timer

    def expire() -> None:              # what pytest-timeout's thread method does for a test
        capman = session.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(in_=True)
        sys.stderr.write(f"\n+++ the collection took more than {COLLECTION_LIMIT:g} s "
                         "(DASK_RESEARCH_COLLECTION_LIMIT); every thread's stack: +++\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    _collection_timer = threading.Timer(COLLECTION_LIMIT, expire)
    _collection_timer.daemon = True
    _collection_timer.start()


def pytest_collection_finish(session: pytest.Session) -> None:
    if _collection_timer is not None:
        _collection_timer.cancel()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if _left_out:
        terminalreporter.write_sep("-", "doctests not collected: optional dependency missing")
        for module, dependency in sorted(_left_out.items()):
            terminalreporter.write_line(f"{module}: needs {dependency}")
