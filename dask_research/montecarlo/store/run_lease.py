"""One writer per run: the run's :class:`~dask_research.durable.Lease`, ``runs/<id>/lease.json``.

The protocol is the durability layer's (:mod:`dask_research.durable.lease`): the lease file
(format ``dask-research-lease/1``, with the run id, owner, host, pid and heartbeat) is created
whole and exclusively, refreshed by a heartbeat every quarter of
``research.montecarlo.lease-timeout`` or every 5 s, whichever is sooner, judged stale only by the waiting process's own
monotonic clock (or a dead pid on this host), taken over under a brief ``flock`` of
``runs/<id>/lease.lock``, and removed at the end. This module adds what is the run store's:
the settings it reads, how it speaks to the user, and the registry through which the store
checks the lease before each write into the run.

A second client of the same job on the same store waits for the first (saying once who holds
the run), then resumes from what it stored; a holder presumed dead is taken over, and a writer
that was taken over stops before its next write instead of writing next to the new holder.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo.store import RunStore
>>> store = RunStore(tempfile.mkdtemp())
>>> with store.lease("ab" * 32, timeout=60) as lease:
...     lease.holder()["run_id"] == "ab" * 32 and lease.holder()["token"] == lease.token
True
>>> store.lease("ab" * 32).holder() is None
True
"""
from __future__ import annotations

import sys
from collections.abc import Callable, MutableMapping
from typing import Any

from ... import durable
from .layout import LEASE_FILE, LEASE_FORMAT, LEASE_LOCK_FILE
from .store_files import StoreFiles

__all__ = ["Lease"]


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Lease(durable.Lease):
    """The one-writer lease of run ``run_id`` in a store (see the module docstring).

    ``timeout`` and ``wait`` default to ``research.montecarlo.lease-timeout`` and
    ``research.montecarlo.lease-wait`` (``None``: wait as long as the holder lives).
    ``announce(message)`` is told once when this lease waits for a live holder and when it takes
    over a stale one (default: stderr). ``registry`` (the store's) holds the lease, by run id,
    while it is held: the store checks it before each write into the run.
    """

    def __init__(self, files: StoreFiles, run_id: str, *, registry: MutableMapping[str, Lease] | None = None,
                 timeout: float | None = None, wait: float | None = None,
                 announce: Callable[[str], None] | None = None):
        from ... import config

        self.run_id = run_id
        self.store_files = files
        self.registry: MutableMapping[str, Lease] = {} if registry is None else registry
        say = announce if announce is not None else _print
        where = f"run {run_id[:12]} in {files.display(files.url)}"

        def announce_kind(kind: str, message: str) -> None:
            if kind == "wait":
                message += "; once it is free this run resumes from what it stored"
            say(message)

        super().__init__(files.files, files.path(run_id, LEASE_FILE), lock_path=files.path(run_id, LEASE_LOCK_FILE),
                         label=where, timeout=config.resolve("montecarlo.lease-timeout", timeout),
                         wait=config.resolve("montecarlo.lease-wait", wait), fmt=LEASE_FORMAT,
                         extra={"run_id": run_id}, announce=announce_kind,
                         hint="research.montecarlo.lease-wait bounds this wait (null: as long as the holder lives)")

    def acquire(self) -> Lease:
        """Take the run's lease (waiting for a live holder, taking over a stale one)."""
        super().acquire()
        self.registry[self.run_id] = self
        return self

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still this lease's."""
        if self.registry.get(self.run_id) is self:
            del self.registry[self.run_id]
        super().release()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
