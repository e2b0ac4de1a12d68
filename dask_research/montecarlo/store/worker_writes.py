"""A run store as a block task on a worker reaches it: one :class:`StoreTarget`, checked once.

The client that holds a run's lease hands every block task the same :class:`StoreTarget`: the
store's location and file-system options, the run id, and the token of that lease. A task
writes its block's shard file with :meth:`StoreTarget.write`, through the store's own writer
(:meth:`~.runstore.RunStore.write_shard_file`: write-then-rename, never overwriting, the same
refusal of a different state under the same name).

A worker writes only where it sees the client's lease: the first block of a run that a worker
process writes opens the store there and reads the run's lease file, which must carry the
target's token. That file is the client's probe (it exists for as long as the run holds the
store); a worker on another host whose "same" local path is another disk, an in-memory store of
another process, or a run whose lease was taken over, does not see that token, and
:meth:`StoreTarget.write` raises :class:`Unwritable` saying why (the block's states then go to
the client, which writes them). The verdict is kept by the worker process, keyed by the store's
location, the run and the token, for the rest of the run (the last :data:`KEPT` runs): one
read of the lease file per worker process and run, not one per block (an object store's GET).
A read that failed (the store could not be opened or read) is tried again at the next block,
and so is a write that failed there. The client keeps the other half of the promise: it checks
its own lease as blocks written by the workers arrive (:meth:`.held_run.HeldRun.check_lease`),
so a run taken over stops.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo import Job, Normal, compute_shard
>>> from dask_research.montecarlo.store import RunStore
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
>>> store = RunStore(tempfile.mkdtemp()).prepare()
>>> with store.lease(job.id) as lease:
...     path, _ = StoreTarget.of(store, job.id, lease.token).write({2: compute_shard(job, 2)}, "w1")
...     StoreTarget.of(store, job.id, "another run's token").write({3: compute_shard(job, 3)}, "w1")
Traceback (most recent call last):
...
dask_research.montecarlo.store.worker_writes.Unwritable: .../lease.json as seen from worker w1 does not hold this run's lease (another store, or the lease was taken over)
>>> sorted(store.read_shards(job.id))
[2]
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...exceptions import StoreError
from ..codec import encode
from .layout import LEASE_FILE
from .runstore import RunStore

__all__ = ["StoreTarget", "Unwritable", "KEPT"]

#: Runs whose verdict a worker process keeps (the most recent ones).
KEPT = 64

_VERDICTS: OrderedDict[tuple[str, str, str], tuple[RunStore, str | None]] = OrderedDict()
_GUARD = threading.Lock()


class Unwritable(Exception):
    """This worker must not, or could not, write the target: the message says why (one line)."""


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
    storage_options: dict = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, store: RunStore, run_id: str, token: str) -> StoreTarget:
        """The target of run ``run_id`` in ``store``, for the holder of the lease with ``token``."""
        return cls(str(store.location), run_id, str(token), dict(store.storage_options))

    def write(self, states: dict[int, Any], worker: str, encoder: Callable = encode) -> tuple[str, str]:
        """Write ``states`` as a shard file; ``(path, checksum)`` (see :meth:`RunStore.write_shard_file`).

        Raises :class:`Unwritable` if ``worker`` does not see this run's lease token in the store
        (decided once per process and run) or the write fails here.
        """
        store, note = self._reach(worker)
        if note is not None:
            raise Unwritable(note)
        try:
            return store.write_shard_file(self.run_id, states, worker, encoder=encoder)
        except StoreError as e:
            raise Unwritable(f"writing on worker {worker} failed: {' '.join(str(e).split())}") from None

    def _reach(self, worker: str) -> tuple[RunStore, str | None]:
        """The store opened here, and why ``worker`` must not write it (``None``: it may)."""
        key = (self.url, self.run_id, self.token)
        with _GUARD:
            known = _VERDICTS.get(key)
            if known is not None:
                _VERDICTS.move_to_end(key)
                return known
            try:
                store = RunStore(self.url, **self.storage_options)
            except (StoreError, OSError, ValueError, ImportError) as e:
                raise Unwritable(f"the store cannot be opened on worker {worker} ({type(e).__name__}: {e})") from None
            where = store.display(store.path(self.run_id, LEASE_FILE))
            try:
                holder = store.lease_holder(self.run_id)
            except (StoreError, OSError, ValueError) as e:
                raise Unwritable(f"{where} cannot be read from worker {worker} ({' '.join(str(e).split())})") from None
            note = None
            if holder is None:
                note = f"{where} is not visible from worker {worker} (another host's disk or process's memory)"
            elif holder.get("token") != self.token:
                note = (f"{where} as seen from worker {worker} does not hold this run's lease (another store, or the "
                        "lease was taken over)")
            _VERDICTS[key] = (store, note)
            while len(_VERDICTS) > KEPT:
                _VERDICTS.popitem(last=False)
            return store, note
