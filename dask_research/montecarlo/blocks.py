"""Block tasks that write their own shard file: the client merges one state per block.

Without this, every shard's accumulator travels to the client, which encodes and writes
each block's shard file itself: 64-76 us of client CPU per shard at 256 shards per task
(benchmarks/bench_montecarlo_scale.py), which capped one client at about 100 cores. A block
task run by :func:`compute_and_store_block` folds its aligned subtree as before (the same
fixed tree over shard indices, so the bits cannot change), writes its block's shard file with
the store's own writer (:meth:`RunStore.write_shard_file`: write-then-rename, no overwrite, the
same refusal of a different state under the same name), and returns its subtree root, the
file and its checksum, and only the shard states the client keeps for verification (the run's
hashed candidates in this block, and the block's first computed shard, which covers a worker
seen for the first time). A spot check therefore still compares one shard, against a state
that is byte for byte the one in the file.

The store is written by the worker only when it is reachable from it, detected conservatively
on every block: the worker must read the run's ``lease.json`` in the store and find the lease
token the client holds. That file is the client's probe (it exists for as long as the run
holds the store); a worker on another host whose "same" local path is another disk, an
in-memory store of another process, or a run whose lease was taken over, does not see that
token, and the block returns every shard state for the client to write as before. So does a
block whose write fails on the worker (a read-only mount): the client then writes it, and a
genuine refusal (a different state under the same name) is raised by the client's write as
before. ``research.montecarlo.store-writes: client`` keeps every write on the client.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import StoreError
from .shard import BlockResult, compute_block

__all__ = ["StoreTarget", "compute_and_store_block", "store_target"]


@dataclass(frozen=True)
class StoreTarget:
    """Where a block task writes its shard file, and the lease token that must be there.

    ``url`` is the store's absolute local path or its fsspec URL, ``storage_options`` the file
    system's options (credentials travel with the task: prefer credentials the workers'
    environment provides).
    """

    url: str
    run_id: str
    token: str
    storage_options: dict = field(default_factory=dict)

    def open(self):
        """The :class:`~.store.RunStore` this target names, opened on the calling process."""
        from .store import RunStore

        return RunStore(self.url, **self.storage_options)


def store_target(store, run_id: str, token: str | None) -> StoreTarget | None:
    """A :class:`StoreTarget` for ``store`` (``None`` without a store or a lease token)."""
    if store is None or not token:
        return None
    return StoreTarget(str(store.location), run_id, str(token), dict(store.storage_options))


def _unreachable(store, target: StoreTarget, worker: str) -> str | None:
    """Why ``worker`` must not write ``target`` (``None``: it sees the client's lease token)."""
    where = store.display(store.path(target.run_id, "lease.json"))
    try:
        holder = store.lease_holder(target.run_id)
    except (StoreError, OSError) as e:
        return f"{where} cannot be read from worker {worker} ({' '.join(str(e).split())})"
    if holder is None:
        return f"{where} is not visible from worker {worker} (another host's disk or process's memory)"
    if holder.get("token") != target.token:
        return f"{where} as seen from worker {worker} does not hold this run's lease (another store, or the lease was taken over)"
    return None


def _trim(res: BlockResult, keep) -> None:
    """Keep only the states the client keeps: ``keep`` and the block's first computed shard."""
    wanted = set(keep)
    wanted.add(res.computed[0])
    res.shard_states = {s: res.shard_states[s] for s in wanted if s in res.shard_states}


def compute_and_store_block(job, reducer, start: int, stop: int, known: Mapping[int, Any] | None,
                            target: StoreTarget | None, keep=(), trim: bool = False) -> BlockResult:
    """:func:`~.shard.compute_block`, then write the block's shard file here if the store is reachable.

    Parameters
    ----------
    job, reducer, start, stop, known
        As :func:`~.shard.compute_block`.
    target : StoreTarget or None
        The store to write; ``None`` returns every shard state (the client writes).
    keep : iterable of int
        Shards of this block whose states the client wants back (verification candidates).
    trim : bool
        Without a ``target``: return only the kept states too (a run without a store, whose
        client needs no other shard state).

    Returns
    -------
    BlockResult
        With ``stored`` and ``checksum`` set and ``shard_states`` cut to ``keep`` plus the first
        computed shard when the file was written here; otherwise with ``store_note`` saying why
        not and every shard state, as :func:`~.shard.compute_block` returns it.
    """
    res = compute_block(job, reducer, start, stop, known)
    if not res.computed:
        return res
    if target is None:
        if trim:
            _trim(res, keep)
        return res
    try:
        store = target.open()
        note = _unreachable(store, target, res.worker)
    except (StoreError, OSError, ValueError, ImportError) as e:
        note = f"the store cannot be opened on worker {res.worker} ({type(e).__name__}: {e})"
    if note is None:
        from .codec import encode

        try:
            path, checksum = store.write_shard_file(target.run_id, {s: res.shard_states[s] for s in res.computed},
                                                    res.worker, encoder=getattr(reducer, "encode", encode))
        except StoreError as e:
            note = f"writing on worker {res.worker} failed: {' '.join(str(e).split())}"
        else:
            _trim(res, keep)
            res.stored, res.checksum = path, checksum
            return res
    res.store_note = note[:500]
    return res
