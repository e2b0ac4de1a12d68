"""Block tasks that write their own shard file: the client merges one state per block.

Without this, every shard's accumulator travels to the client, which encodes and writes
each block's shard file itself: 64-76 us of client CPU per shard at 256 shards per task
(benchmarks/bench_montecarlo_scale.py), which capped one client at about 100 cores. A block
task run by :func:`compute_and_store_block` folds its aligned subtree as before (the same
fixed tree over shard indices, so the bits cannot change), writes its block's shard file
through the run's :class:`~.store.worker_writes.StoreTarget` (the store's own writer:
write-then-rename, no overwrite, the same refusal of a different state under the same name),
and returns its subtree root, the file and its checksum, and only the shard states the client
keeps for verification (the run's hashed candidates in this block, and the block's first
computed shard, which covers a worker seen for the first time). A spot check therefore still
compares one shard, against a state that is byte for byte the one in the file.

The store is written by the worker only when it is reachable from it: the worker process must
see the client's lease token in the run's lease file, checked once per worker process and run
(:mod:`.store.worker_writes`). A worker on another host whose "same" local path is another disk,
an in-memory store of another process, or a run whose lease was taken over, does not see that
token, and the block returns every shard state for the client to write as before. So does a
block whose write fails on the worker (a read-only mount): the client then writes it, and a
genuine refusal (a different state under the same name) is raised by the client's write as
before. ``research.montecarlo.store-writes: client`` keeps every write on the client.

Examples
--------
A block without a store returns its root and only the states the client keeps:

>>> from dask_research.montecarlo import Job, Normal
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=8, samples_per_shard=64, seed=1, range=(-8, 8))
>>> reducer = job.make_reducer(job.range)
>>> res = compute_and_store_block(job, reducer, 0, 4, {}, None, keep=(2,), trim=True)
>>> res.computed, sorted(res.shard_states), res.stored
([0, 1, 2, 3], [0, 2], None)

With a store whose lease the caller holds, the block writes its own shard file:

>>> import tempfile
>>> from dask_research.montecarlo.store import HeldRun, RunStore
>>> with HeldRun(RunStore(tempfile.mkdtemp()).prepare(), job.id) as held:
...     res = compute_and_store_block(job, reducer, 4, 8, {}, held.target(), keep=(6,))
...     sorted(held.store.read_shards(job.id)), res.stored.endswith("000000000004-000000000008.json")
([4, 5, 6, 7], True)
>>> sorted(res.shard_states), res.store_note
([4, 6], None)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .codec import encode
from .shard_compute import BlockResult, compute_block
from .store.worker_writes import Unwritable

if TYPE_CHECKING:
    from .store.worker_writes import StoreTarget

__all__ = ["compute_and_store_block"]


def _trim(res: BlockResult, keep) -> None:
    """Keep only the states the client keeps: ``keep`` and the block's first computed shard."""
    wanted = set(keep)
    wanted.add(res.computed[0])
    res.shard_states = {s: res.shard_states[s] for s in wanted if s in res.shard_states}


def compute_and_store_block(job, reducer, start: int, stop: int, known: Mapping[int, Any] | None,
                            target: StoreTarget | None, keep=(), recheck: tuple[int, ...] = (),
                            trim: bool = False) -> BlockResult:
    """:func:`~.shard_compute.compute_block`, then write the block's shard file here if the store is reachable.

    Parameters
    ----------
    job, reducer, start, stop, known
        As :func:`~.shard_compute.compute_block`.
    target : StoreTarget or None
        The store to write; ``None`` returns every shard state (the client writes).
    keep : iterable of int
        Shards of this block whose states the client wants back (verification candidates).
    recheck : tuple of int
        Shards of other blocks to recompute for verification (:func:`~.shard_compute.compute_block`).
    trim : bool
        Without a ``target``: return only the kept states too (a run without a store, whose
        client needs no other shard state).

    Returns
    -------
    BlockResult
        With ``stored`` and ``checksum`` set and ``shard_states`` cut to ``keep`` plus the first
        computed shard when the file was written here; otherwise with ``store_note`` saying why
        not and every shard state, as :func:`~.shard_compute.compute_block` returns it.
    """
    res = compute_block(job, reducer, start, stop, known, recheck)
    if not res.computed:
        return res
    if target is None:
        if trim:
            _trim(res, keep)
        return res
    try:
        res.stored, res.checksum = target.write({s: res.shard_states[s] for s in res.computed}, res.worker,
                                                encoder=getattr(reducer, "encode", encode))
    except Unwritable as e:
        res.store_note = str(e)[:500]
        return res
    _trim(res, keep)
    return res
