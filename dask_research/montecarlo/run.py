"""Run a job on a Dask cluster: verified, persisted as it goes, resumable.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a, b: a * b, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
...              shards=8, samples_per_shard=4096, seed=1)
>>> result = mc.run(job, store="runs/", progress=False)    # doctest: +SKIP
>>> round(result.mean, 2)                                   # doctest: +SKIP
2.0
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

from .. import config
from .._cluster import get_client, workers_info
from ..exceptions import InputError, StoreError
from .engine import Execution
from .job import Job
from .linearize import linearize
from .mergers import check_merger as _check_merger
from .pilot import Pilot
from .pilot import pilot as _pilot
from .result import Result
from .store import Holdings, RunStore
from .tree import choose_block

__all__ = ["run", "plan_blocks", "open_store"]


def plan_blocks(job: Job, shard_seconds: float, threads: int, shards_per_task: int | None = None) -> int:
    """Shards per task: the caller's (a power of two) or sized from the pilot's timing."""
    if shards_per_task is not None:
        b = shards_per_task
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or b & (b - 1):
            raise InputError("shards_per_task", b, "a power of two (tasks compute aligned subtrees "
                             "of the reduction tree)", where="run")
        return b
    return choose_block(job.shards, shard_seconds, threads,
                        float(config.resolve("montecarlo.task-seconds")),
                        int(config.resolve("montecarlo.max-shards-per-task")),
                        client_block_seconds=_client_block_seconds())


def _client_block_seconds() -> float:
    """``research.montecarlo.client-block-seconds``: the client's CPU per block, >= 0 seconds."""
    from ..exceptions import ConfigError

    value = config.resolve("montecarlo.client-block-seconds")
    try:
        seconds = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or not seconds >= 0 or seconds != seconds:
        raise ConfigError("montecarlo.client-block-seconds", value, "a non-negative number of seconds "
                          "(0 sizes tasks by task-seconds alone)")
    return seconds


def _progress_bar(total: int, enabled: bool, desc: str):
    """A bar that updates in a terminal and in a notebook (:mod:`dask_research.progress`)."""
    from ..progress import make_bar

    return make_bar(total=total, unit="shard", desc=desc, disable=not enabled, leave=False)


def open_store(store: Any, must_exist: bool = False) -> RunStore | None:
    """``None``, a :class:`RunStore`, or a path / fsspec URL to open as one.

    With ``must_exist`` (readers: show, replay, verify) a store that does not exist raises
    :class:`~dask_research.exceptions.StoreError` instead of looking empty.
    """
    if store is None:
        return None
    if isinstance(store, RunStore):
        rs = store
    elif not isinstance(store, (str, bytes)) and not hasattr(store, "__fspath__"):
        raise InputError("store", store, "a local path, an fsspec URL or a RunStore", where="run")
    else:
        raw = store.decode() if isinstance(store, bytes) else str(getattr(store, "__fspath__", lambda: store)())
        if not raw.strip():
            raise InputError("store", store, "a non-empty local path or fsspec URL", where="run")
        try:
            rs = RunStore(raw)
        except (ValueError, ImportError, OSError) as e:
            raise StoreError(raw, f"cannot be opened as a store ({type(e).__name__}: {e})") from None
    return rs.require() if must_exist else rs


class JobRegistry:
    """The jobs built in this process, and the pipelines they were built on: what replay may run.

    Every :class:`Job` adds itself when it is built (weakly: a job lives while the caller
    keeps it). Its pipeline is kept too, weakly, while it lives anywhere (a script's function
    outlives ``del job``), so ``replay(run_id, shard, store)`` in the script or console that
    built the job finds it. Nothing else of a module is ever a candidate: a helper function of
    ``__main__`` that no job was built on is never called because a manifest names it.
    """

    def __init__(self) -> None:
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self._pipelines: weakref.WeakSet[Any] = weakref.WeakSet()
        self._guard = threading.Lock()

    def add(self, job: Job) -> None:
        """Record ``job`` (and its pipeline, where it can be referred to weakly)."""
        with self._guard:
            self._jobs.add(job)
            with contextlib.suppress(TypeError):     # a builtin or bound method: kept through its job
                self._pipelines.add(job.pipeline)

    def get(self, run_id: str) -> Job | None:
        """A live job built here whose content address is ``run_id``."""
        with self._guard:
            jobs = list(self._jobs)
        for job in jobs:
            try:
                if job.id == run_id:
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
_JOBS = JobRegistry()


def remember_job(job: Job) -> None:
    """Record ``job`` as one this process built, so ``replay(job.id, ...)`` finds its pipeline."""
    _JOBS.add(job)


def run(job: Job, client=None, *, store: Any = None, verify: int | None = None,
        shards_per_task: int | None = None, progress: bool | None = None,
        check_merger: bool | None = None, pilot: Pilot | None = None,
        speculate: float | None = None, window: int | None = None) -> Result:
    """Run ``job`` and return its verified :class:`Result`.

    Parameters
    ----------
    job : Job
    client : distributed.Client, optional
        Default: the current client, else an embedded ``LocalCluster`` for this call.
    store : str or RunStore, optional
        A path or fsspec URL. The manifest and every accepted shard's accumulator are written
        as they arrive; a re-run of the same job computes only the shards that are missing.
    verify : int, optional
        Shards recomputed on a different worker before the result is accepted (default
        ``research.montecarlo.verify``; at least one shard of every producing worker is checked).
    shards_per_task : int, optional
        A power of two; default sized from the pilot so a task takes about
        ``research.montecarlo.task-seconds``. Never changes the result's bits.
    progress : bool, optional
        Progress bar of accepted shards (default ``research.montecarlo.progress``).
    check_merger : bool, optional
        Property-check the reducer's merge on pilot states first.
    pilot : Pilot, optional
        A pilot already run for this job.
    speculate : float, optional
        Near the end, duplicate a block running longer than this many median block times
        (default ``research.montecarlo.speculate``; 0 disables).
    window : int, optional
        Blocks in flight at once (default ``research.montecarlo.window``; ``None``: 8 per thread).
    """
    if not isinstance(job, Job):
        raise InputError("job", job, "a dask_research.montecarlo.Job", where="run")
    progress = bool(config.resolve("montecarlo.progress", progress))
    verify = int(config.resolve("montecarlo.verify", verify))
    if verify < 0:
        raise InputError("verify", verify, "a non-negative number of shards", where="run")
    speculate = float(config.resolve("montecarlo.speculate", speculate))
    rs = open_store(store)
    if rs is not None:
        rs.prepare()                      # a store that is a file or cannot be created: before any computing
    # Pilot, ask the store once what it holds of the job, execute the rest.
    p = pilot if pilot is not None else _pilot(job)
    # One writer per run: a second client of the same job on the same store waits here for the
    # first, then resumes from what it stored (so it computes nothing the first one finished).
    with rs.lease(job.id) if rs is not None else contextlib.nullcontext() as lease:
        held = rs.holdings(job, p) if rs is not None else Holdings(job.shards)
        if held.range is not None:
            p.range = held.range
        reducer = job.make_reducer(p.range)
        if config.resolve("montecarlo.check-merger", check_merger) and len(p.states) >= 3:
            _check_merger(reducer.merge, p.states, identity=reducer.init())
        result = _execute(job, client, p, reducer, rs, held, verify, shards_per_task,
                          progress, speculate, window, store_token=getattr(lease, "token", None))
    remember_job(job)
    return result


def _execute(job: Job, client, p: Pilot, reducer, rs: RunStore | None, held: Holdings, verify: int,
             shards_per_task: int | None, progress: bool, speculate: float, window: int | None,
             store_token: str | None = None) -> Result:
    with get_client(client) as c:
        check_memory(c, p)
        t0 = time.perf_counter()
        threads = max(1, sum(c.nthreads().values()))
        block = plan_blocks(job, p.shard_seconds, threads, shards_per_task)
        win = config.resolve("montecarlo.window", window) or max(16, 8 * threads)
        bar = _progress_bar(job.shards, progress, f"mc {job.name}")
        try:
            ex = Execution(c, job, reducer, block, run_id=job.id, known=dict(held.states),
                           known_producers=dict(held.producers), store=rs, verify=verify, window=win,
                           speculate=speculate, progress=bar,
                           shard_seconds=p.shard_seconds,   # the block timeout from the first block on
                           store_token=store_token)         # the workers' probe of the store (issue 20)
            state, outcome = ex.execute()
        finally:
            bar.close()
        wall = time.perf_counter() - t0
        ex.events.emit("done", job.id, n=getattr(state, "n", None), mean=getattr(state, "mean", None),
                       wall=wall, computed=outcome.computed, reused=outcome.reused)
        ex.events.flush()           # the run's events, done last, are in the log when it returns
    lin = linearize(job) if job.reducer is None else None
    result = Result(job.id, state, reducer.finalize(state), lin, p.to_dict(), wall, job.shards,
                    job.samples_per_shard, block, outcome.workers, outcome.verification or None,
                    outcome.computed, job.name, reused_shards=outcome.reused, speculated=outcome.speculated,
                    max_in_flight=outcome.max_in_flight)
    if rs is not None:
        summary = result.summary()
        summary["state"] = _encode_state(reducer, state)
        summary["store_writes"] = _store_writes_record(outcome.store_writes)
        summary["groups"] = dict(outcome.groups) or None
        rs.write_result(job.id, summary)
    return result


def _store_writes_record(rec: dict | None) -> dict | None:
    """Who wrote the run's shard files, for result.json: ``mode`` workers, client or mixed."""
    if rec is None:
        return None
    w, c = rec["blocks_by_workers"], rec["blocks_by_client"]
    mode = "workers" if w and not c else "client" if c and not w else "mixed" if w else "none (nothing computed)"
    return {"mode": mode, **rec}


def check_memory(client, p: Pilot) -> None:
    """Refuse up front a job whose shard cannot fit the memory a worker thread has."""
    from ..exceptions import CapacityError

    for addr, info in workers_info(client).items():
        limit = info.get("memory_limit") or 0
        threads = max(1, int(info.get("nthreads") or 1))
        if limit and p.shard_bytes * threads > limit:
            raise CapacityError(f"a shard of {p.job.samples_per_shard:,} samples (measured by the pilot) on each of "
                                f"{threads} threads of worker {addr}; use fewer samples_per_shard and more shards",
                                p.shard_bytes * threads, int(limit))


def _encode_state(reducer, state) -> Any:
    from .codec import CodecError, encode

    try:
        return getattr(reducer, "encode", encode)(state)
    except CodecError:
        return None
