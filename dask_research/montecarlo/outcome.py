"""What an execution of a run did, besides its root state: the figures its result reports.

The engine's parts each add what they decide (:mod:`.acceptance` the computed shards and who
wrote the store, :mod:`.block_watch` the retries, :mod:`.submission` the most blocks in
flight, :mod:`.verification` the checks); :func:`~.run.run` reads it into the
:class:`~.result.Result` and ``result.json``.

Examples
--------
>>> outcome = Outcome(reused=4)
>>> outcome.count("tcp://w1", 8)
>>> outcome.count("tcp://w1", 8)
>>> outcome.computed, outcome.workers
(16, {'tcp://w1': 16})
>>> outcome.store_writes = store_writes_start("auto", None)
>>> outcome.store_writes["blocks_by_workers"] += 2
>>> outcome.store_writes_summary()["mode"]
'workers'
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Outcome", "store_writes_start"]


def store_writes_start(setting: str, client_reason: str | None) -> dict:
    """The record of who writes a run's shard files, before any block arrived.

    ``setting``: ``research.montecarlo.store-writes``; ``client_reason``: why the client writes
    every block from the start (``None``: the block tasks write where they can).
    """
    return {"setting": setting, "blocks_by_workers": 0, "blocks_by_client": 0, "client_reason": client_reason}


@dataclass
class Outcome:
    """What an execution produced, besides the root state."""

    computed: int = 0
    reused: int = 0
    workers: dict[str, int] = field(default_factory=dict)
    verification: dict = field(default_factory=dict)
    speculated: list = field(default_factory=list)
    max_in_flight: int = 0
    retried: list = field(default_factory=list)
    #: Who wrote the store's shard files (see :mod:`.blocks`); ``None`` without a store.
    store_writes: dict | None = None
    #: Blocks per group (:mod:`.groups`), groups formed, and groups opened (waited on block by block).
    groups: dict = field(default_factory=dict)

    def count(self, worker: str, shards: int) -> None:
        """``worker`` computed ``shards`` more shards."""
        self.computed += shards
        self.workers[worker] = self.workers.get(worker, 0) + shards

    def store_writes_summary(self) -> dict | None:
        """Who wrote the run's shard files, for ``result.json``: ``mode`` workers, client or mixed."""
        rec = self.store_writes
        if rec is None:
            return None
        w, c = rec["blocks_by_workers"], rec["blocks_by_client"]
        mode = "workers" if w and not c else "client" if c and not w else "mixed" if w else "none (nothing computed)"
        return {"mode": mode, **rec}
