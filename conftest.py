"""Collection rules shared by the tests and the package's doctests.

``python -m pytest`` collects ``tests/`` and the doctests of every module of ``dask_research``
(``--doctest-modules``, setup.cfg); the ``data`` directories of the tests are never collected.
A package module whose top-level imports need an optional dependency that is not installed
here (CuPy, torch, Ray, ...) is left out of the collection (:mod:`dask_research.testing.optional`
reads its imports), and the run ends by saying which modules it left out and why; every other
module's examples run. A collection that takes longer than :data:`COLLECTION_LIMIT` seconds
ends the run with every thread's stack. On a CPython whose ``ast.parse`` fails at random in
threaded programs, it is guarded first (:mod:`dask_research.testing.ast_guard`).
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
from pathlib import Path

import pytest

from dask_research.testing import ast_guard
from dask_research.testing.optional import missing_dependency

# CPython 3.11.7 (CI's) fails ast.parse at random when a garbage collection in the middle of
# a parse runs a finalizer that parses too (python/cpython#106905): guard it for the whole run.
ast_guard.install()

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


def _collects_here(config: pytest.Config) -> bool:
    """False in pytest-xdist's controller, which collects nothing (its workers do, each under its
    own limit) and never calls ``pytest_collection_finish``: a limit armed there would end every
    run longer than the limit, not a collection."""
    if hasattr(config, "workerinput"):
        return True
    return not (getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") != "no")


def pytest_sessionstart(session: pytest.Session) -> None:
    global _collection_timer
    if not _collects_here(session.config):
        return

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


# ---------------------------------------------------------------------------------------------
# Parallel runs (pytest-xdist; setup.cfg's addopts say ``-n auto --dist loadgroup``).
#
# * ``-n auto`` starts :func:`parallel_workers` processes: most tests of this suite wait on
#   other processes (a cluster starting, a worker frozen on purpose, a SLURM job), so a 2-core
#   machine runs more workers than cores.
# * The tests that use the session's SLURM run on one worker (one SLURM for the run), and so
#   do the tests of a module that builds a module-scoped fixture (their ``xdist_group`` mark).
# * A test that times out ends its worker (the thread method's ``os._exit``): its report (every
#   thread's stack and what the test printed) is written where the controller reads it and
#   shown as that test's failure, and the test is not run again on the replacement worker
#   (xdist's group scheduling would re-queue it, and each replacement would hang there too).
# ---------------------------------------------------------------------------------------------

_TIMEOUT_REPORTS = "DASK_RESEARCH_TIMEOUT_REPORTS"


def parallel_workers(cpus: int) -> int:
    """How many worker processes ``-n auto`` starts on a machine with ``cpus`` CPUs.

    >>> [parallel_workers(n) for n in (1, 2, 4, 16)]
    [2, 4, 6, 8]
    """
    return max(2, min(8, cpus + 2))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return parallel_workers(len(os.sched_getaffinity(0)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ReportOnceScheduling(LoadGroupScheduling):
        """Group scheduling that reports a test whose worker crashed once, as a failure, and
        re-queues only the tests after it."""

        def remove_node(self, node):
            workload = self.assigned_work.get(node, {})
            crashed = next((nodeid for unit in workload.values() for nodeid, done in unit.items()
                            if not done), None)
            for unit in workload.values():
                if crashed in unit:
                    unit[crashed] = True
            super().remove_node(node)
            return crashed

    return ReportOnceScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))


def _report_path(directory: str, nodeid: str) -> Path:
    import hashlib

    return Path(directory) / (hashlib.sha256(nodeid.encode()).hexdigest()[:32] + ".txt")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):         # the controller (or a run without -n)
        import tempfile

        config._timeout_reports = tempfile.mkdtemp(prefix="dask-research-timeouts-")  # type: ignore[attr-defined]
        os.environ[_TIMEOUT_REPORTS] = config._timeout_reports  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = getattr(config, "_timeout_reports", None)
    if directory is not None:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


class _ReportLines:
    """The two methods of a terminal writer that pytest-timeout's ``dump_stacks`` calls."""

    def __init__(self, file) -> None:
        self.file = file

    def sep(self, char: str, title: str = "") -> None:
        self.file.write(f"{char * 20} {title} {char * 20}\n")

    def write(self, text: str) -> None:
        self.file.write(text)


def _expire_in_worker(item: pytest.Item, seconds: float, directory: str) -> None:
    """pytest-timeout's thread method, with the report written to a file the controller shows."""
    try:
        import pytest_timeout

        capman = item.config.pluginmanager.getplugin("capturemanager")
        out = err = ""
        if capman is not None:
            capman.suspend_global_capture(in_=True)
            out, err = capman.read_global_capture()
        path = _report_path(directory, item.nodeid)
        with open(path, "w") as f:
            lines = _ReportLines(f)
            lines.sep("+", f"Timeout: {item.nodeid} ran more than {seconds:g} s")
            if out:
                lines.sep("~", "Captured stdout")
                lines.write(out)
            if err:
                lines.sep("~", "Captured stderr")
                lines.write(err)
            pytest_timeout.dump_stacks(lines)
            lines.sep("+", "Timeout")
        os.write(2, path.read_bytes())          # seen live too, where the worker's stderr goes
    except BaseException:                      # the worker ends whatever went wrong above
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> bool | None:
    directory = os.environ.get(_TIMEOUT_REPORTS)
    if not hasattr(item.config, "workerinput") or settings.method != "thread" or not directory:
        return None
    timer = threading.Timer(settings.timeout, _expire_in_worker, (item, settings.timeout, directory))
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]   # pytest-timeout's cancel hook calls it
    timer.start()
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    directory = os.environ.get(_TIMEOUT_REPORTS)
    if directory is None:
        return
    path = _report_path(directory, crashitem)
    if path.exists():
        report.longrepr = f"{report.longrepr}\n{path.read_text(errors='replace')}"
