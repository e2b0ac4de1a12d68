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
import math
import platform
import time
import weakref
from typing import Any

import numpy as np

from .. import config
from .._cluster import get_client, workers_info
from .._version import __version__
from ..exceptions import InputError, StoreError
from .accumulators import Moments
from .engine import Execution
from .job import ENGINE, Job
from .linearize import linearize
from .mergers import check_merger as _check_merger
from .pilot import Pilot
from .pilot import pilot as _pilot
from .result import Result
from .store import RunStore
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
                        float(config.get("montecarlo.task-seconds")),
                        int(config.get("montecarlo.max-shards-per-task")),
                        client_block_seconds=_client_block_seconds())


def _client_block_seconds() -> float:
    """``research.montecarlo.client-block-seconds``: the client's CPU per block, >= 0 seconds."""
    from ..exceptions import ConfigError

    value = config.get("montecarlo.client-block-seconds")
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


#: Jobs this process has run or rebuilt, by content address (weak: they live while the caller keeps them).
_JOBS: weakref.WeakValueDictionary[str, Job] = weakref.WeakValueDictionary()


def remember_job(job: Job) -> None:
    """Record ``job`` as one this process built, so ``replay(job.id, ...)`` finds its pipeline."""
    _JOBS[job.id] = job


def _manifest(job: Job, p: Pilot, origin: dict | None) -> dict:
    import dask
    import distributed

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats

        features = sorted(k for k, v in feats.items() if v)
    except Exception:  # pragma: no cover - numpy internals moved
        features = []
    return {
        "job": job.describe(),
        "name": job.name,
        "range": list(p.range) if p.range else None,
        "pilot": p.to_dict(),
        "engine": dict(ENGINE),
        "versions": {"dask_research": __version__, "numpy": np.__version__, "dask": dask.__version__,
                     "distributed": distributed.__version__, "python": platform.python_version()},
        "cpu_features": features,
        "origin": origin or _origin(job),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _origin(job: Job) -> dict:
    import inspect

    fn = job.pipeline
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    return {"module": getattr(fn, "__module__", None), "qualname": getattr(fn, "__qualname__", None),
            "file": path}


def _load_existing(store: RunStore, job: Job) -> tuple[dict, dict[int, Any], dict[int, str]]:
    """:func:`_holdings` of a run that must have its manifest (nothing is written)."""
    return _holdings(store, job, None, None)


def _holdings(store: RunStore, job: Job, p: Pilot | None, origin: dict | None) -> tuple[dict, dict[int, Any], dict[int, str]]:
    """Ask the store once what it holds of ``job``: nothing, or these valid shards under this manifest.

    A run with a manifest is checked against the job. Shards without a manifest (a deleted
    manifest) are validated against the job and the pilot's range, which is a deterministic
    function of the job, and reused; the manifest is then written again. The caller holds the
    run's lease, so nobody else writes while this is read.
    """
    mpath = store.display(store.run_dir(job.id) + "/manifest.json")
    store.refuse_links(job.id)
    if store.has_run(job.id):
        manifest = store.read_manifest(job.id)
        if manifest["engine"] != ENGINE:
            raise StoreError(mpath, f"was written by engine {manifest['engine']}; this is {ENGINE}: "
                             "results of different engines are never mixed (use another store)")
        if manifest["job"] != job.describe():
            raise StoreError(mpath, "describes a different job than the one with this id (edited or corrupt)")
        rng = manifest["range"]
        if rng is not None and not (isinstance(rng, list) and len(rng) == 2
                                    and all(isinstance(v, (int, float)) and math.isfinite(v) for v in rng)
                                    and rng[0] < rng[1]):
            raise StoreError(mpath, f"has range {rng!r}; expected [lo, hi] with finite lo < hi")
        orphan = False
    elif p is None:
        manifest = store.read_manifest(job.id)      # raises: does not exist
    else:
        manifest = _manifest(job, p, origin)
        rng = manifest["range"]
        orphan = True
    stored = store.read_shards(job.id)
    reducer = job.make_reducer(tuple(rng) if rng is not None else None) if (rng or job.frozen) else None
    template = reducer.init() if reducer is not None else None
    for s, (state, _, fpath) in stored.items():
        problem = None
        if not 0 <= s < job.shards:
            problem = f"holds shard {s}, outside [0, {job.shards})"
        elif isinstance(template, Moments):
            if not isinstance(state, Moments):
                problem = f"holds a {type(state).__name__} for shard {s}, not an accumulator"
            elif (state.lo, state.hi, state.bins) != (template.lo, template.hi, template.bins):
                problem = f"shard {s} has histogram [{state.lo}, {state.hi}) x {state.bins}, not the run's"
            elif state.n != job.samples_per_shard:
                problem = f"shard {s} counts {state.n:,} samples, not {job.samples_per_shard:,}"
        elif template is not None and type(state) is not type(template):
            problem = f"holds a {type(state).__name__} for shard {s}; the reducer's state is a {type(template).__name__}"
        if problem:
            if orphan:
                problem += (f"; the run's manifest is missing, so these shards cannot be reused: delete "
                            f"{store.display(store.run_dir(job.id))} to compute the run again")
            raise StoreError(store.display(fpath), problem)
    if orphan:
        store.write_manifest(job.id, manifest)
    return manifest, {s: v[0] for s, v in stored.items()}, {s: v[1] for s, v in stored.items()}


def run(job: Job, client=None, *, store: Any = None, verify: int | None = None,
        shards_per_task: int | None = None, progress: bool | None = None,
        check_merger: bool | None = None, pilot: Pilot | None = None,
        speculate: float | None = None, window: int | None = None, origin: dict | None = None) -> Result:
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
    progress = bool(config.get("montecarlo.progress", progress))
    verify = int(config.get("montecarlo.verify", verify))
    if verify < 0:
        raise InputError("verify", verify, "a non-negative number of shards", where="run")
    speculate = float(config.get("montecarlo.speculate", speculate))
    rs = open_store(store)
    if rs is not None:
        rs.prepare()                      # a store that is a file or cannot be created: before any computing
    p = pilot if pilot is not None else _pilot(job)
    # One writer per run: a second client of the same job on the same store waits here for the
    # first, then resumes from what it stored (so it computes nothing the first one finished).
    with rs.lease(job.id) if rs is not None else contextlib.nullcontext() as lease:
        known: dict[int, Any] = {}
        producers: dict[int, str] = {}
        if rs is not None:
            manifest, known, producers = _holdings(rs, job, p, origin)
            if manifest["range"] is not None:
                p.range = tuple(manifest["range"])
        reducer = job.make_reducer(p.range)
        if config.get("montecarlo.check-merger", check_merger) and len(p.states) >= 3:
            _check_merger(reducer.merge, p.states, identity=reducer.init())
        result = _execute(job, client, p, reducer, rs, known, producers, verify, shards_per_task,
                          progress, speculate, window, store_token=getattr(lease, "token", None))
    remember_job(job)
    return result


def _execute(job, client, p, reducer, rs, known, producers, verify, shards_per_task, progress,
             speculate, window, store_token=None) -> Result:
    with get_client(client) as c:
        check_memory(c, p)
        t0 = time.perf_counter()
        threads = max(1, sum(c.nthreads().values()))
        block = plan_blocks(job, p.shard_seconds, threads, shards_per_task)
        win = config.get("montecarlo.window", window) or max(16, 8 * threads)
        bar = _progress_bar(job.shards, progress, f"mc {job.name}")
        try:
            ex = Execution(c, job, reducer, block, run_id=job.id, known=known, known_producers=producers,
                           store=rs, verify=verify, window=win, speculate=speculate, progress=bar,
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
