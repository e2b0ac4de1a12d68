"""The jobs built in this process, and their pipelines: the only code ``replay`` may run unasked.

Every :class:`~.job.Job` records itself here when it is built (:func:`remember_job`), and so
does every job a run or a replay was given. ``replay(run_id, shard, store)`` without ``job=``
looks here first (:meth:`JobRegistry.get`), then rebuilds the job from the manifest on one of
these pipelines (:meth:`JobRegistry.pipelines`); nothing a manifest names is imported.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> def double(a):
...     return 2 * a
>>> registry = JobRegistry()
>>> job = Job(double, {"a": Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1)
>>> registry.add(job)
>>> registry.get(job.id) is job, registry.pipelines() == [double]
(True, True)
>>> registry.clear()
>>> registry.get(job.id) is None
True
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

#: A :class:`~.job.Job` (the registry reads its ``id`` and ``pipeline``; it never imports the
#: module, which records every job it builds here).
_Job = Any

__all__ = ["JobRegistry", "JOBS", "remember_job"]


class JobRegistry:
    """The jobs built in this process, and the pipelines they were built on: what replay may run.

    Every :class:`Job` adds itself when it is built (weakly: a job lives while the caller
    keeps it). Its pipeline is kept too, weakly, while it lives anywhere (a script's function
    outlives ``del job``), so ``replay(run_id, shard, store)`` in the script or console that
    built the job finds it. Nothing else of a module is ever a candidate: a helper function of
    ``__main__`` that no job was built on is never called because a manifest names it.
    """

    def __init__(self) -> None:
        self._jobs: weakref.WeakSet[_Job] = weakref.WeakSet()
        self._pipelines: weakref.WeakSet[Any] = weakref.WeakSet()
        self._guard = threading.Lock()

    def add(self, job: _Job) -> None:
        """Record ``job`` (and its pipeline, where it can be referred to weakly)."""
        with self._guard:
            self._jobs.add(job)
            with contextlib.suppress(TypeError):     # a builtin or bound method: kept through its job
                self._pipelines.add(job.pipeline)

    def get(self, run_id: str, scheme: int | None = None) -> _Job | None:
        """A live job built here whose content address (under ``scheme``; default: the current
        one) is ``run_id``."""
        with self._guard:
            jobs = list(self._jobs)
        for job in jobs:
            try:
                if (job.id if scheme is None else job.address(scheme)) == run_id:
                    return job
            except Exception:     # a pipeline without a content address: never a match
                continue
        return None

    def pipelines(self) -> list[Any]:
        """The pipelines of the jobs built here, each once."""
        with self._guard:
            found = [j.pipeline for j in self._jobs] + list(self._pipelines)
        out: list[Any] = []
        seen: set[int] = set()
        for fn in found:
            if id(fn) not in seen:
                seen.add(id(fn))
                out.append(fn)
        return out

    def clear(self) -> None:
        """Forget every job (as if this process had built none)."""
        with self._guard:
            self._jobs.clear()
            self._pipelines.clear()


#: Jobs built in this process (see :class:`JobRegistry`).
JOBS = JobRegistry()


def remember_job(job: _Job) -> None:
    """Record ``job`` as one this process built, so ``replay(job.id, ...)`` finds its pipeline."""
    JOBS.add(job)
