"""Priority updates of a cluster plane, routed to the shards that own the transitions.

The learner queues ``(indices, priorities)`` with :meth:`PriorityRouter.queue`; a batch's
global indices say which shard each transition came from
(:mod:`~dask_research.replay.cluster.indices`). :meth:`PriorityRouter.ship` sends what is
queued, one ``shard_ops.update_priorities`` task per owning shard pinned to its worker (the
learner's own shard is updated in process), at most every ``interval`` seconds unless forced;
updates for lost shards are dropped and counted; :meth:`PriorityRouter.flush` ships and waits
until the shards applied them (a shard applies only keys it still holds: stale ones count as
not applied). An update task that ran but whose reply cannot be fetched (its key was cancelled
or its worker left meanwhile: seen once under load, where Dask's ``Future.result`` then raised
``UnboundLocalError`` in the learner's delivery thread) counts as ``updates_unconfirmed``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from typing import Any

import numpy as np

from . import shard_ops
from .indices import decode
from .table import ShardTable
from .waiting import wait_all


class PriorityRouter:
    """Queue, ship and flush the priority updates of plane ``name`` (see the module docstring).

    Parameters
    ----------
    client : distributed.Client
    name : str
        The plane's name on the workers.
    table : ShardTable
        Says which shards are live, where they are and whether one is the learner's own.
    interval : float
        Seconds between the shipments of :meth:`ship` with ``force=False``.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_research.replay.cluster.indices import encode
    >>> from dask_research.replay.cluster.table import ShardRef
    >>> class Table:               # what the router asks of the shard table
    ...     def get(self, sid):
    ...         return {0: ShardRef(0, "tcp://w:1", "u1", lost=True)}.get(sid)
    ...     def is_local(self, ref):
    ...         return False
    >>> router = PriorityRouter(client=None, name="p", table=Table(), interval=0.05)
    >>> router.queue(encode(0, np.arange(3)), np.ones(3))
    3
    >>> router.flush(), router.counters["updates_dropped_lost"]     # shard 0 was lost
    (0, 3)
    """

    def __init__(self, client: Any, name: str, table: ShardTable, interval: float):
        self.client = client
        self.name = name
        self.table = table
        self.interval = float(interval)
        self.counters = {"updates_queued": 0, "updates_dropped_lost": 0, "updates_applied": 0,
                         "updates_unconfirmed": 0}
        self._lock = threading.RLock()
        self._updates: list[tuple[np.ndarray, np.ndarray]] = []
        self._futures: list[tuple[Any, int]] = []     # (update task, how many updates it carries)
        self._last_ship: float | None = None     # time.monotonic() of the last shipment; None: never

    def queue(self, indices: np.ndarray, priorities: np.ndarray) -> int:
        """Queue new ``priorities`` (validated) for global ``indices``; returns how many."""
        with self._lock:
            self._updates.append((indices.copy(), priorities.copy()))
            self.counters["updates_queued"] += len(indices)
        return len(indices)

    def ship(self, force: bool = True) -> None:
        """Send the queued updates to their shards (with ``force=False``: only if the last
        shipment is ``interval`` old)."""
        with self._lock:
            if not self._updates:
                return
            now = time.monotonic()
            if not force and self._last_ship is not None and now - self._last_ship < self.interval:
                return
            self._last_ship = now
            ups, self._updates = self._updates, []
            idx = np.concatenate([u[0] for u in ups])
            pr = np.concatenate([u[1] for u in ups])
            sids, keys = decode(idx)
            keep, finished = [], []
            for f, n in self._futures:
                if f.status == "pending":
                    keep.append((f, n))
                elif f.status == "finished":
                    finished.append((f, n))
            self._futures = keep
            jobs = []
            for sid in np.unique(sids):
                m = sids == sid
                ref = self.table.get(int(sid))
                if ref is None or ref.lost:
                    self.counters["updates_dropped_lost"] += int(m.sum())
                    continue
                ref.updates_sent += int(m.sum())
                jobs.append((ref, keys[m], pr[m]))
        for f, n in finished:            # fetched outside the lock, as flush() does
            self._count_reply(f, n)
        submitted = []
        for ref, k, p in jobs:
            if self.table.is_local(ref):
                applied = self.table.local_shard().update(ref.uid, k, p)
                with self._lock:
                    self.counters["updates_applied"] += applied
                continue
            submitted.append((self.client.submit(
                shard_ops.update_priorities, self.name, ref.uid, k, p, workers=[ref.address],
                allow_other_workers=False, pure=False,
                key=f"replay-update-{self.name}-{uuid.uuid4().hex}"), len(k)))
        # Under the lock: a flush in the learner's thread racing a shipment from the delivery
        # thread must see every future (or it returns before that update is applied).
        with self._lock:
            self._futures.extend(submitted)

    def flush(self, timeout: float = 60) -> int:
        """Ship queued priority updates and wait until they are applied; returns how many
        were applied (stale keys and lost shards excluded)."""
        self.ship()
        with self._lock:
            futs, self._futures = self._futures, []
        if futs:
            wait_all([f for f, _ in futs], timeout)
        return sum(self._count_reply(f, n) for f, n in futs if f.status == "finished")

    def _count_reply(self, future: Any, n: int) -> int:
        """Count how many of its ``n`` updates a finished task applied, and return it; when its
        reply cannot be fetched any more, count the ``n`` as unconfirmed and return 0."""
        try:
            applied = int(future.result(timeout=60))
        except (Exception, asyncio.CancelledError, concurrent.futures.CancelledError):
            with self._lock:
                self.counters["updates_unconfirmed"] += n
            return 0
        with self._lock:
            self.counters["updates_applied"] += applied
        return applied
