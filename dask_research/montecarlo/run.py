"""Run a job on a Dask cluster: verified, persisted as it goes, resumable.

:func:`run` builds the run's :class:`~.run_settings.RunSettings` once from its keywords and
``dask.config`` (every bad value refused before anything is computed), opens the store, runs
the pilot, refuses what the cluster cannot run (before the store holds anything of the run),
holds the run's lease (:class:`~.store.held_run.HeldRun`, the one way the run reaches its
store), asks the store once what it holds of the job, and executes the rest
(:class:`~.engine.Execution`). The settings travel whole, and ``result.json`` records them.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a, b: a * b, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
...              shards=8, samples_per_shard=4096, seed=1)
>>> result = mc.run(job, store="runs/", progress=False)    # doctest: +SKIP
>>> round(result.mean, 2)                                   # doctest: +SKIP
2.0
>>> plan_blocks(job, shard_seconds=0.01, threads=2)         # 0.3 s tasks, 4 tasks a thread at most
1
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, NamedTuple

from .._cluster import get_client, workers_info
from ..exceptions import InputError, StoreError
from .engine import Execution
from .imports import check_importable
from .job import Job
from .job_registry import remember_job
from .linearize import linearize
from .mergers import check_merger as _check_merger
from .pilot import Pilot
from .pilot import pilot as _pilot
from .result import Result
from .run_settings import RunSettings, parameters_doc, run_signature
from .store import HeldRun, Holdings, RunStore
from .tree import choose_block

__all__ = ["run", "plan_blocks", "open_store"]


def plan_blocks(job: Job, shard_seconds: float, threads: int, settings: RunSettings | None = None) -> int:
    """Shards per task: the settings' ``shards_per_task`` (a power of two), or sized from the pilot's timing.

    ``settings``: the run's (default: :meth:`RunSettings.parse`, from the config).
    """
    s = settings if settings is not None else RunSettings.parse()
    if s.shards_per_task is not None:
        return s.shards_per_task
    return choose_block(job.shards, shard_seconds, threads, s.task_seconds, s.max_shards_per_task,
                        client_block_seconds=s.client_block_seconds)


def check_device(job: Job) -> None:
    """Refuse a device job (``device="gpu"`` or ``"any"``) before anything runs.

    The engine's blocks, checks and replays draw with the ordinary (``cpu``) path only; a device
    job's address records the portable algorithm and its tolerance class, so its store would
    claim draws it does not hold. Until the engine dispatches on the device, such a job is
    refused in one line, and its blocks run with :mod:`dask_research.montecarlo.gpu`'s own
    functions (docs/gpu.rst).

    >>> from dask_research.montecarlo import Job, Normal
    >>> check_device(Job(lambda a: a, {"a": Normal(0, 1)}, shards=2, samples_per_shard=8, seed=1, range=(-8, 8)))
    """
    device = getattr(job, "device", "cpu")
    if device != "cpu":
        raise InputError("device", device, "'cpu': mc.run does not run device jobs yet (their blocks would "
                         "be drawn with the ordinary path while the job's address records the portable one); "
                         "run their blocks with montecarlo.gpu.compute_block_portable, see docs/gpu.rst",
                         where=f"run of {job.name}")


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


def run(job: Job, *args: Any, client: Any = None, store: Any = None, pilot: Pilot | None = None,
        **settings: Any) -> Result:
    """Run ``job`` and return its verified :class:`Result`.

    Parameters
    ----------
    job : Job
    client : distributed.Client, optional
        Default: the current client, else an embedded ``LocalCluster`` for this call. A keyword,
        as in every entry point of the package (``mc.run(job, client)`` still works, with a
        ``DeprecationWarning``).
    store : str or RunStore, optional
        A path or fsspec URL. The manifest and every accepted shard's accumulator are written
        as they arrive; a re-run of the same job computes only the shards that are missing.
    pilot : Pilot, optional
        A pilot already run for this job.
{settings}

    Every keyword left ``None`` reads ``research.montecarlo.*``, and so does every other setting
    of the run (:class:`~dask_research.montecarlo.run_settings.RunSettings`): each is checked
    once, before anything runs, and ``result.json`` records them (``settings``).
    """
    if not isinstance(job, Job):
        raise InputError("job", job, "a dask_research.montecarlo.Job", where="run")
    if args:
        if len(args) > 1 or client is not None:
            raise TypeError("mc.run takes the job by position; pass client= and every setting by keyword")
        warnings.warn("mc.run(job, client) is deprecated: pass mc.run(job, client=client)", DeprecationWarning,
                      stacklevel=2)
        client = args[0]
    s = RunSettings.from_keywords(settings)
    check_device(job)
    rs = open_store(store)
    try:
        if rs is not None:
            rs.prepare()                  # a store that is a file or cannot be created: before any computing
        result = _run(job, client, rs, pilot, s)
    except BaseException:
        if rs is not None:               # refused before it stored anything: no empty store left
            rs.files.discard_if_unused()  # (a store with anything in it stays as it is)
        raise
    remember_job(job)
    return result


def _run(job: Job, client: Any, rs: RunStore | None, pilot: Pilot | None, s: RunSettings) -> Result:
    """:func:`run` once its settings are checked and its store (if any) prepared."""
    # Pilot, refuse what cannot run, ask the store once what it holds of the job, execute the rest.
    p = pilot if pilot is not None else _pilot(job)
    if s.check_merger and job.reducer is not None and len(p.states) >= 3:     # a user's merge
        reducer = job.make_reducer(p.range)
        _check_merger(reducer.merge, p.states, identity=reducer.init(), rtol=s.merger_rtol)
    with contextlib.ExitStack() as stack:
        # The lease is released last, after an embedded cluster has closed (and killed what still
        # ran on its workers), as when it was taken first; it is taken after the refusals.
        lease = stack.enter_context(contextlib.ExitStack())
        c = stack.enter_context(get_client(client))
        plan = _admit(c, job, p, s)       # every refusal before the store holds anything of the run
        held_run = None
        if rs is not None:
            # One writer per run: a second client of the same job on the same store waits here for
            # the first, then resumes from what it stored (so it computes nothing the first one finished).
            held_run = HeldRun(rs, job.id, timeout=s.lease_timeout, wait=s.lease_wait)
            asked = time.monotonic()
            lease.enter_context(held_run)
            if time.monotonic() - asked > REPLAN_AFTER_WAIT:
                plan = _admit(c, job, p, s)   # the cluster may have grown or shrunk meanwhile
        held = held_run.holdings(job, p) if held_run is not None else Holdings(job.shards)
        if held.range is not None:
            p.range = held.range
        return _execute(job, c, p, job.make_reducer(p.range), plan, held, held_run)


#: Seconds of waiting for the run's lease (another client running the same job on the same store)
#: after which the cluster is asked again for the run's plan: its workers may have changed.
REPLAN_AFTER_WAIT = 1.0


run.__signature__ = run_signature(run)  # type: ignore[attr-defined]
if run.__doc__:
    run.__doc__ = run.__doc__.replace(
        "{settings}", "\n".join("    " + line if line else line for line in parameters_doc().splitlines()))


class _Plan(NamedTuple):
    """What the admission checks found: the workers, their threads, the task size, the settings."""
    workers: dict
    threads: int
    block: int
    settings: RunSettings


def _admit(client, job: Job, p: Pilot, settings: RunSettings) -> _Plan:
    """Refuse, in one line each, a job this cluster cannot run: a shard larger than a worker
    thread's memory, a pipeline the workers cannot import, a task size whose bookkeeping cannot
    fit the client; else the run's plan."""
    workers = check_memory(client, p)
    check_importable(client, job.pipeline, job.id)   # a module only this client has: one line, now
    threads = max(1, sum(int(info.get("nthreads") or 0) for info in workers.values()))
    block = plan_blocks(job, p.shard_seconds, threads, settings)
    check_bookkeeping(job, block, p, by_pilot=settings.shards_per_task is None)
    return _Plan(workers, threads, block, settings.for_cluster(threads))


def _execute(job: Job, c, p: Pilot, reducer, plan: _Plan, held: Holdings, store: HeldRun | None) -> Result:
    settings, block = plan.settings, plan.block
    t0 = time.perf_counter()
    bar = _progress_bar(job.shards, settings.progress, f"mc {job.name}")
    try:
        ex = Execution(c, job, reducer, block, settings=settings, holdings=held, store=store, progress=bar,
                       shard_seconds=p.shard_seconds,   # the block timeout from the first block on
                       shard_bytes=p.shard_bytes, workers=plan.workers, threads=plan.threads)
        state, outcome = ex.execute()
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    ex.events.emit("done", job.id, n=getattr(state, "n", None), mean=getattr(state, "mean", None),
                   wall=wall, computed=outcome.computed, reused=outcome.reused)
    ex.events.flush()           # the run's events, done last, are in the log when it returns
    lin = linearize(job, step=settings.finite_difference_step) if job.reducer is None else None
    result = Result(job.id, state, reducer.finalize(state), linearized=lin, pilot=p.to_dict(), wall_seconds=wall,
                    shards=job.shards, samples_per_shard=job.samples_per_shard, shards_per_task=block,
                    workers=outcome.workers, verification=outcome.verification or None,
                    computed_shards=outcome.computed, name=job.name, reused_shards=outcome.reused,
                    speculated=outcome.speculated, max_in_flight=outcome.max_in_flight, settings=settings)
    if store is not None:
        summary = result.summary()
        summary["state"] = _encode_state(reducer, state)
        summary["store_writes"] = outcome.store_writes_summary()
        summary["groups"] = dict(outcome.groups) or None
        store.write_result(summary)
    return result


def check_memory(client, p: Pilot) -> dict:
    """Refuse up front a job whose shard cannot fit the memory a worker thread has; the workers' information."""
    from ..exceptions import CapacityError

    workers = workers_info(client)
    for addr, info in workers.items():
        limit = info.get("memory_limit") or 0
        threads = max(1, int(info.get("nthreads") or 1))
        if limit and p.shard_bytes * threads > limit:
            raise CapacityError(f"a shard of {p.job.samples_per_shard:,} samples (measured by the pilot) on each of "
                                f"{threads} threads of worker {addr}; use fewer samples_per_shard and more shards",
                                p.shard_bytes * threads, int(limit))
    return workers


#: Bytes of the client's bookkeeping a run may need at most: the fold keeps each block's state
#: (a quarantine folds them again) and the run holds each block's bounds.
BOOKKEEPING_BYTES = 1 << 30
#: Bytes of the client's bookkeeping per block besides its state (its bounds, its place in the
#: queue, its key and future while in flight).
BLOCK_OVERHEAD_BYTES = 400


def check_bookkeeping(job: Job, block: int, p: Pilot, by_pilot: bool = False) -> None:
    """Refuse a task size whose bookkeeping on the client cannot fit :data:`BOOKKEEPING_BYTES`.

    The client keeps every block's folded state: ``shards_per_task=1`` on a 10^7-shard job held
    1.9 GB after 60 s and spent 75 s before its first block. The state's size is the pilot's.
    ``by_pilot``: ``block`` is the pilot's choice, not the user's, and the message says so.

    >>> from dask_research import montecarlo as mc
    >>> job = mc.Job(lambda a: a, {"a": mc.Normal(0, 1)}, shards=10**7, samples_per_shard=64, seed=1)
    >>> from types import SimpleNamespace
    >>> pilot = SimpleNamespace(states=[job.make_reducer((-8.0, 8.0)).init()])   # what the pilot folded
    >>> check_bookkeeping(job, 64, pilot)                                         # 156,250 tasks: fits
    >>> check_bookkeeping(job, 1, pilot)
    Traceback (most recent call last):
    ...
    dask_research.exceptions.InputError: run of <lambda>: shards_per_task=1 is invalid; expected a task size ...
    """
    import pickle

    blocks = -(-job.shards // block)
    state = len(pickle.dumps(p.states[0])) if p.states else 1024
    need = blocks * (state + BLOCK_OVERHEAD_BYTES)
    if need <= BOOKKEEPING_BYTES:
        return
    per = state + BLOCK_OVERHEAD_BYTES
    fits = 1
    while -(-job.shards // fits) * per > BOOKKEEPING_BYTES:
        fits *= 2
    keep = (f"{job.shards:,} shards in {blocks:,} tasks keep about {need / 2**30:.1f} GiB on the client "
            f"({state:,} bytes of folded state and {BLOCK_OVERHEAD_BYTES} of bookkeeping a task, at most "
            f"{BOOKKEEPING_BYTES / 2**30:.0f} GiB)")
    if by_pilot:
        longest = fits * p.shard_seconds
        raise InputError("shards_per_task", block, (
            f"a task size whose bookkeeping fits the client: the pilot chose {block} shards a task (about "
            f"{block * p.shard_seconds:,.3g} s each), and {keep}; pass shards_per_task={fits} or more (about "
            f"{longest:,.3g} s a task), or split the job into smaller ones"), where=f"run of {job.name}")
    raise InputError("shards_per_task", block, (
        f"a task size whose bookkeeping fits the client: {keep}; use shards_per_task={fits} or more, "
        "or leave it to the pilot"), where=f"run of {job.name}")


def _encode_state(reducer, state) -> Any:
    from .codec import CodecError, encode

    try:
        return getattr(reducer, "encode", encode)(state)
    except CodecError:
        return None
