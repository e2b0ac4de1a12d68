"""A pipeline module the cluster cannot import: which one, where, and how to fix it.

A block task carries the pipeline by reference to its module (by value only for code defined
in ``__main__`` or a console). Where the scheduler cannot import that module, Dask marks the
tasks erred with "Error during deserialization of the task graph" and no traceback; where only
the workers cannot, each task fails with a ``ModuleNotFoundError``. Either way
:func:`unimportable_error` turns the failure into one :class:`~dask_research.exceptions.ResearchError`
naming the module, the processes that cannot import it, and the three fixes.

>>> missing_modules(["json", "no_such_module_28"])
['no_such_module_28']
>>> import functools, json
>>> pipeline_modules(json.dumps)
['json']
>>> pipeline_modules(functools.partial(json.dumps, indent=1))
['json']
"""
from __future__ import annotations

import functools
import importlib
import sys
import threading
from typing import Any

from ..exceptions import ResearchError

__all__ = ["missing_modules", "pipeline_modules", "looks_unimportable", "unimportable_error", "check_importable"]

#: Seconds the check before a run waits for the scheduler's and the workers' answers (a frozen
#: worker never answers: the run then goes on, and its blocks are copied elsewhere).
CHECK_SECONDS = 10.0


def missing_modules(names: list[str]) -> list[str]:
    """Which of ``names`` this process cannot import (run on the scheduler and on each worker)."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    return missing


def pipeline_modules(pipeline: Any) -> list[str]:
    """The modules a pipeline is pickled by reference to (``__main__``, sent by value, is not one)."""
    f = pipeline
    while isinstance(f, functools.partial):
        f = f.func
    if not hasattr(f, "__code__") and not hasattr(f, "__module__"):
        f = type(f)          # a callable object: pickled by reference to its class
    mod = getattr(f, "__module__", None)
    # A module that is not in sys.modules (a CLI job file: jobfile.py takes it out) is pickled by value too.
    return [mod] if mod and mod not in ("__main__", "builtins") and not mod.startswith("<") and mod in sys.modules else []


def looks_unimportable(exc: BaseException | None) -> bool:
    """Whether a block's error is a module that could not be imported where the task went."""
    if exc is None:
        return False
    return isinstance(exc, ImportError) or "deserializ" in str(exc).lower()


def check_importable(client: Any, pipeline: Any, run_id: str, timeout: float = CHECK_SECONDS) -> None:
    """Before a run: raise :func:`unimportable_error`'s error if the cluster cannot import the pipeline.

    A worker that cannot deserialize a task leaves it waiting forever (Dask logs the error on
    the worker only); asking first costs one broadcast. A cluster that does not answer within
    ``timeout`` seconds (a frozen worker) is not waited for.
    """
    if not pipeline_modules(pipeline):
        return
    out: dict[str, Any] = {}

    def ask() -> None:
        out["error"] = unimportable_error(client, None, pipeline, run_id)

    t = threading.Thread(target=ask, name="dask-research-import-check", daemon=True)
    t.start()
    t.join(timeout)
    if out.get("error") is not None:
        raise out["error"]


def unimportable_error(client: Any, exc: BaseException | None, pipeline: Any, run_id: str) -> ResearchError | None:
    """The error naming the pipeline module the scheduler or the workers cannot import, or ``None``.

    Asks the scheduler and every worker which of the pipeline's modules (and the module the
    error names) they cannot import; ``None`` if every one imports everywhere (another error).
    """
    names = pipeline_modules(pipeline)
    named = getattr(exc, "name", None)
    if isinstance(exc, ImportError) and named and named not in names:
        names.append(str(named))
    if not names:
        return None
    where: list[str] = []
    missing: list[str] = []
    try:
        on_scheduler = client.run_on_scheduler(missing_modules, names)
    except Exception:
        on_scheduler = []
    if on_scheduler:
        where.append("the scheduler")
        missing += list(on_scheduler)
    try:
        on_workers = client.run(missing_modules, names, on_error="return")
    except Exception:
        on_workers = {}
    bad = sorted(w for w, m in on_workers.items() if isinstance(m, list) and m)
    if bad:
        where.append("the workers" if len(bad) == len(on_workers) else "workers " + ", ".join(bad))
        for w in bad:
            missing += [m for m in on_workers[w] if m not in missing]
    if not missing:
        return None
    mods = ", ".join(repr(m) for m in missing)
    first = missing[0].split(".")[0]
    return ResearchError(
        f"run {run_id[:12]}: {' and '.join(where)} cannot import the pipeline's module {mods} "
        f"(only this client can): install it there, send it with client.upload_file('{first}.py') before "
        "the run, or run the job from the command line as FILE:job, which sends the code by value; "
        "nothing was computed with it")
