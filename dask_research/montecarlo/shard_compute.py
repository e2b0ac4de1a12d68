"""What runs on a worker: a shard's or a block of shards' accumulators.

A task computes an aligned block of shards and folds them with the fixed tree, so the split
into tasks never changes the bits. Any shard can be recomputed alone with
:func:`compute_shard`. Drawing the inputs and running the pipeline is :mod:`.evaluate`.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> job = Job(lambda a: a * 2, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=256,
...           seed=1, range=(-8, 8))
>>> compute_shard(job, 3) == compute_shard(job, 3)
True
>>> block = compute_block(job, job.make_reducer(), 0, 4)
>>> block.computed, block.shard_states[3] == compute_shard(job, 3)
([0, 1, 2, 3], True)
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import InputError, PipelineError
from . import philox
from .accumulators import Reducer
from .evaluate import describe_error, evaluate
from .pilot import pilot as run_pilot
from .tree import tree_fold

__all__ = ["compute_shard", "compute_block", "BlockResult"]


def compute_shard(job, shard: int, reducer: Reducer | None = None,
                  range: tuple[float, float] | None = None) -> Any:
    """Recompute shard ``shard`` alone; the same bits as inside any run on this machine.

    The accumulator is ``reducer``'s, else the job's on ``range``, else, for a job whose
    histogram range is not frozen, on the range of its pilot (:func:`.pilot.pilot`, run here:
    a deterministic function of the job).
    """
    if not 0 <= shard < job.shards:
        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=repr(job))
    if reducer is None and range is None and not job.frozen:
        range = run_pilot(job).range
    reducer = reducer or job.make_reducer(range)
    y = evaluate(job, philox.shard_generator(job.key, shard), job.samples_per_shard, shard)
    return reducer.update(reducer.init(), y)


@dataclass
class BlockResult:
    """A task's output: the block's folded state and each shard's own state (or its stored file)."""

    start: int
    stop: int
    state: Any
    shard_states: dict[int, Any] = field(repr=False)
    computed: list[int] = field(default_factory=list)
    worker: str = "local"
    seconds: float = 0.0
    #: Set when the task wrote its shard file itself (see :mod:`.blocks`): the file and the
    #: sha256 of its states. ``shard_states`` then holds only the few the client keeps.
    stored: str | None = None
    checksum: str | None = None
    #: Why the task did not write the store itself (the client then writes ``shard_states``).
    store_note: str | None = None
    #: Shards of *other* blocks this task recomputed for verification (``recheck``): shard -> state.
    rechecks: dict[int, Any] = field(default_factory=dict, repr=False)


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return "local"


def _on_worker(err: PipelineError, worker: str) -> PipelineError:
    """``err`` with the worker that raised it in its message and as ``err.worker``."""
    out = PipelineError(err.shard, f"{err.problem} (on worker {worker})", count=err.count)
    out.worker = worker   # type: ignore[attr-defined]
    return out


def _shard_state(job, reducer: Reducer, shard: int, worker: str) -> Any:
    """One shard's state inside a task; a failure is a :class:`PipelineError` naming ``worker``."""
    try:
        y = evaluate(job, philox.shard_generator(job.key, shard), job.samples_per_shard, shard)
        return reducer.update(reducer.init(), y)
    except PipelineError as e:
        raise _on_worker(e, worker) from e.__cause__
    except Exception as e:       # the reducer's update, a MemoryError, ...
        raise _on_worker(PipelineError(shard, f"accumulating it raised {describe_error(e)}"), worker) from e


def compute_block(job, reducer: Reducer, start: int, stop: int,
                  known: Mapping[int, Any] | None = None, recheck: tuple[int, ...] = ()) -> BlockResult:
    """Compute shards ``start..stop-1`` (reusing ``known`` states) and fold them with the tree.

    ``recheck``: shards of other blocks to recompute as well, for verification (their states
    are returned in ``rechecks``, never folded): on a one-worker cluster the run's checks ride
    in its last blocks instead of being tasks of their own (:mod:`.verification`).
    """
    t0 = time.perf_counter()
    known = dict(known or {})
    worker = _worker_address()
    states: dict[int, Any] = {}
    computed = []
    for shard in range(start, stop):
        if shard in known:
            states[shard] = known[shard]
            continue
        states[shard] = _shard_state(job, reducer, shard, worker)
        computed.append(shard)
    folded = tree_fold(reducer.merge, [states[s] for s in range(start, stop)])
    rechecks = {s: _shard_state(job, reducer, s, worker) for s in recheck}
    return BlockResult(start, stop, folded, states, computed, worker, time.perf_counter() - t0, rechecks=rechecks)
