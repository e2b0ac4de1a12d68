"""Run a job on a Dask cluster: blocks of shards as tasks, merges as a fixed tree of futures.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a, b: a * b, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
...              shards=8, samples_per_shard=4096, seed=1)
>>> result = mc.run(job, progress=False)          # doctest: +SKIP
>>> round(result.mean, 2)                          # doctest: +SKIP
2.0
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .. import config
from .._cluster import get_client
from ..exceptions import InputError
from .job import Job
from .linearize import linearize
from .mergers import check_merger as _check_merger
from .pilot import Pilot, pilot as _pilot
from .result import Result
from .shard import BlockResult, compute_block
from .tree import block_bounds, choose_block

__all__ = ["run", "plan_blocks"]


def _state(x: Any) -> Any:
    return x.state if isinstance(x, BlockResult) else x


def merge_nodes(reducer, a: Any, b: Any) -> Any:
    """A merge task of the tree: combine two children (block results or merged states)."""
    return reducer.merge(_state(a), _state(b))


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
                        int(config.get("montecarlo.max-shards-per-task")))


def _progress_bar(total: int, enabled: bool, desc: str):
    """A tqdm.auto bar (a widget in Jupyter) without tqdm's monitor thread."""
    from tqdm.auto import tqdm

    class Bar(tqdm):
        monitor_interval = 0

    return Bar(total=total, unit="shard", desc=desc, disable=not enabled, leave=False)


def run(job: Job, client=None, *, shards_per_task: int | None = None, progress: bool | None = None,
        check_merger: bool | None = None, pilot: Pilot | None = None) -> Result:
    """Run ``job`` and return its :class:`Result`.

    Parameters
    ----------
    job : Job
    client : distributed.Client, optional
        Default: the current client, else an embedded ``LocalCluster`` for this call.
    shards_per_task : int, optional
        A power of two; default sized from the pilot so a task takes about
        ``research.montecarlo.task-seconds``. Never changes the result's bits.
    progress : bool, optional
        Progress bar (default ``research.montecarlo.progress``).
    check_merger : bool, optional
        Property-check the reducer's merge on pilot states first (default
        ``research.montecarlo.check-merger``).
    pilot : Pilot, optional
        A pilot already run for this job.
    """
    if not isinstance(job, Job):
        raise InputError("job", job, "a dask_research.montecarlo.Job", where="run")
    progress = bool(config.get("montecarlo.progress", progress))
    p = pilot if pilot is not None else _pilot(job)
    reducer = job.make_reducer(p.range)
    if config.get("montecarlo.check-merger", check_merger) and len(p.states) >= 3:
        _check_merger(reducer.merge, p.states, identity=reducer.init())
    with get_client(client) as c:
        return _run_on(c, job, p, reducer, shards_per_task, progress)


def _run_on(client, job: Job, p: Pilot, reducer, shards_per_task, progress) -> Result:
    from distributed import as_completed

    t0 = time.perf_counter()
    threads = max(1, sum(client.nthreads().values()))
    block = plan_blocks(job, p.shard_seconds, threads, shards_per_task)
    tag = job.id[:16]
    bounds = block_bounds(job.shards, block)
    leaves = [client.submit(compute_block, job, reducer, a, b, key=f"mc-block-{tag}-{a}-{b}")
              for a, b in bounds]
    level, depth, merges = leaves, 0, []
    while len(level) > 1:
        depth += 1
        nxt = [client.submit(merge_nodes, reducer, level[i], level[i + 1],
                             key=f"mc-merge-{tag}-{block}-{depth}-{i // 2}")
               for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        merges.extend(nxt)
        level = nxt
    root = level[0]
    workers: Counter = Counter()
    computed = 0
    bar = _progress_bar(job.shards, progress, f"mc {job.name}")
    try:
        for _, block_result in as_completed(leaves, loop=client.loop, with_results=True):
            workers[block_result.worker] += block_result.stop - block_result.start
            computed += len(block_result.computed)
            bar.update(block_result.stop - block_result.start)
        state = _state(root.result())
    except BaseException:
        client.cancel(leaves + merges)
        raise
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    lin = linearize(job) if job.reducer is None else None
    return Result(job.id, state, reducer.finalize(state), lin, p.to_dict(), wall, job.shards,
                  job.samples_per_shard, block, dict(workers), None, computed, job.name)
