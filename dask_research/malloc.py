"""glibc malloc settings that keep NumPy-heavy workers off the page-fault path.

A Monte-Carlo shard allocates a few MiB of NumPy arrays (draws, pipeline temporaries) and frees
them again, thousands of times. With glibc's defaults, memory freed at the top of a *thread's*
arena is handed back to the kernel once it exceeds the trim threshold (about twice the largest
recent allocation), and the next shard faults every page in again: on the benchmark machine
about 480 page faults per 65,536-sample shard with two worker threads, which held two threads
to 0.77 of twice one thread. Worker processes started by Dask's nanny are worse off: the nanny
sets ``MALLOC_TRIM_THRESHOLD_=65536`` (to give memory back eagerly), and setting any malloc
parameter turns glibc's dynamic mmap threshold off, so every temporary of 128 KiB or more is a
fresh ``mmap``.

Pinning both thresholds (``research.cluster.malloc-mmap-threshold``, default 32 MiB, and
``research.cluster.malloc-trim-threshold``, default 64 MiB) removes the faults: two threads
then reach 0.95-0.99 of twice one thread on the same kernel (measured, see docs/scaling). The
price is that up to the trim threshold of freed memory per arena stays with the process
instead of going back to the kernel at once.

Where it is applied:

- the embedded in-process ``LocalCluster`` calls :func:`tune_malloc` for this process;
- embedded worker *processes* get the two variables through Dask's
  ``distributed.nanny.pre-spawn-environ`` (:func:`process_worker_environ`);
- on a cluster you started yourself, ``client.register_plugin(MallocTuning())`` applies the
  settings in every worker process, now and when workers join.

Set either key to ``null`` to leave glibc alone. On systems without glibc (macOS, Windows,
musl) nothing is changed and :func:`tune_malloc` returns ``False``.

Examples
--------
>>> from dask_research.malloc import tune_malloc, process_worker_environ
>>> sorted(process_worker_environ())  # doctest: +NORMALIZE_WHITESPACE
['distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_',
 'distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_']
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from typing import Any

from distributed import WorkerPlugin

from . import config
from .events import Outbox, envelope

__all__ = ["MallocTuning", "malloc_settings", "process_worker_environ", "tune_malloc"]

# mallopt(3) parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_applied: dict[str, int] = {}


def _bytes(name: str, value: Any) -> int | None:
    from dask.utils import parse_bytes

    from .exceptions import ConfigError

    if value is None:
        return None
    expected = "a positive size in bytes (33554432) or a string like '32MiB', or null"
    try:
        out = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cluster.{name}", value, expected) from exc
    if out <= 0:
        raise ConfigError(f"cluster.{name}", value, expected)
    return out


def malloc_settings(mmap_threshold: Any = None, trim_threshold: Any = None) -> dict[str, int]:
    """The thresholds to apply, in bytes, from the arguments or ``research.cluster.*``.

    A key set to ``null`` in the config (and not given) is left out.
    """
    out = {}
    for name, arg in (("malloc-mmap-threshold", mmap_threshold),
                      ("malloc-trim-threshold", trim_threshold)):
        value = _bytes(name, config.resolve(f"cluster.{name}", arg, default=None))
        if value is not None:
            out[name] = value
    return out


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # glibc only (musl has no mallopt thresholds)
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def tune_malloc(mmap_threshold: Any = None, trim_threshold: Any = None) -> bool:
    """Pin glibc's mmap and trim thresholds for this process (``mallopt``).

    Returns ``True`` when the settings are in effect, ``False`` where there is no glibc or
    both keys are ``null``. Applying the same settings again is a no-op.

    Examples
    --------
    >>> from dask_research.malloc import tune_malloc
    >>> tune_malloc("32MiB", "64MiB") in (True, False)   # False off glibc
    True
    """
    settings = malloc_settings(mmap_threshold, trim_threshold)
    if not settings:
        return False
    libc = _libc()
    if libc is None:
        return False
    with _lock:
        if all(_applied.get(k) == v for k, v in settings.items()):
            return True
        for key, param in (("malloc-mmap-threshold", _M_MMAP_THRESHOLD),
                           ("malloc-trim-threshold", _M_TRIM_THRESHOLD)):
            if key in settings and libc.mallopt(param, ctypes.c_int(settings[key])) == 1:
                _applied[key] = settings[key]
        return all(_applied.get(k) == v for k, v in settings.items())


def process_worker_environ() -> dict[str, str]:
    """Dask config that passes the thresholds to spawned worker processes (the nanny's
    ``pre-spawn-environ``), replacing its ``MALLOC_TRIM_THRESHOLD_=65536``."""
    names = {"malloc-mmap-threshold": "MALLOC_MMAP_THRESHOLD_",
             "malloc-trim-threshold": "MALLOC_TRIM_THRESHOLD_"}
    return {f"distributed.nanny.pre-spawn-environ.{names[k]}": str(v)
            for k, v in malloc_settings().items()}


class MallocTuning(WorkerPlugin):
    """Worker plugin: :func:`tune_malloc` in every worker process of a cluster.

    Register it once; workers that join later get it too::

        from dask_research.malloc import MallocTuning
        client.register_plugin(MallocTuning())

    The thresholds are read from ``research.cluster.*`` where the plugin is created (your
    client) and travel with it. Each worker logs a ``malloc-tuning`` event (whether the
    settings are in effect, and the thresholds) on ``research.cluster.event-topic``.
    """

    name = "research-malloc-tuning"

    def __init__(self, mmap_threshold: Any = None, trim_threshold: Any = None):
        self.settings = malloc_settings(mmap_threshold, trim_threshold)

    def setup(self, worker: Any) -> None:
        tuned = tune_malloc(self.settings.get("malloc-mmap-threshold"),
                            self.settings.get("malloc-trim-threshold"))
        Outbox(worker, "cluster", worker=True).put(envelope("cluster", "malloc-tuning", None, applied=tuned, **self.settings))

    def teardown(self, worker: Any) -> None:
        pass
