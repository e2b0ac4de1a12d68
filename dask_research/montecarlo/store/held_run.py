"""A run whose lease this process holds: the one way a running run reaches its store.

:func:`~dask_research.montecarlo.run.run` opens the store, enters a :class:`HeldRun` (which
takes the run's lease, see :mod:`.run_lease`), asks it once what the store holds of the job, and
hands it to the engine. Everything the run then reads or writes goes through it: the shard files
the client writes (:meth:`HeldRun.write_shards`), the :class:`~.worker_writes.StoreTarget` the
block tasks write through on the workers (:meth:`HeldRun.target`: the lease token travels with
it, checked once per worker process), the check of its own lease as blocks written by the
workers arrive (:meth:`HeldRun.check_lease`), the files moved aside after a failed check
(:meth:`HeldRun.quarantine`), and ``result.json`` (:meth:`HeldRun.write_result`). Leaving it
releases the lease.

Examples
--------
>>> import tempfile
>>> from dask_research.montecarlo import Job, Normal, RunStore, compute_shard, pilot
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
>>> store = RunStore(tempfile.mkdtemp()).prepare()
>>> with HeldRun(store, job.id, timeout=30) as held:
...     held.holdings(job, pilot(job)).status
...     path = held.write_shards({0: compute_shard(job, 0)}, "w1")
...     held.target().token == held.lease.token
'nothing'
True
>>> sorted(held.stored_files()), store.lease_holder(job.id) is None
([0], True)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..codec import encode
from .holdings import Holdings
from .run_lease import Lease
from .runstore import RunStore
from .worker_writes import StoreTarget

if TYPE_CHECKING:
    from ..job import Job
    from ..pilot import Pilot

__all__ = ["HeldRun"]


class HeldRun:
    """Run ``run_id`` of ``store``, for as long as this object holds its lease (enter it).

    ``timeout`` and ``wait`` are the lease's (``research.montecarlo.lease-timeout`` and
    ``lease-wait`` where ``None``).
    """

    def __init__(self, store: RunStore, run_id: str, *, timeout: float | None = None, wait: float | None = None):
        self.store, self.run_id = store, run_id
        self.lease: Lease = store.lease(run_id, timeout=timeout, wait=wait)

    def __enter__(self) -> HeldRun:
        self.lease.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lease.release()

    @property
    def where(self) -> str:
        """The run's directory, as messages show it."""
        return self.store.display(self.store.run_dir(self.run_id))

    def display(self, path: str) -> str:
        """``path`` as messages show it (without credentials)."""
        return self.store.display(path)

    # -- before the run ---------------------------------------------------------------------------
    def holdings(self, job: Job, pilot: Pilot | None = None) -> Holdings:
        """What the store holds of ``job``, asked once (see :meth:`RunStore.holdings`)."""
        return self.store.holdings(job, pilot)

    def target(self) -> StoreTarget:
        """Where the block tasks write the run's shard files, with this lease's token."""
        return StoreTarget.of(self.store, self.run_id, self.lease.token)

    # -- as blocks arrive -------------------------------------------------------------------------
    def write_shards(self, states: dict[int, Any], worker: str, encoder: Callable = encode) -> str:
        """Write ``states`` (computed by ``worker``) as the client: the store checks the lease first."""
        return self.store.write_shards(self.run_id, states, worker, encoder=encoder)

    def check_lease(self) -> None:
        """Stop (a :class:`~dask_research.exceptions.StoreError`) if the lease was taken over.

        Costs nothing while the lease was seen to be ours within half a heartbeat; else one
        read of the lease file.
        """
        self.lease.check_held()

    # -- after a failed check -----------------------------------------------------------------------
    def stored_files(self) -> dict[int, tuple[str, str]]:
        """``{shard: (worker named in its file, file)}`` of every stored shard (states not decoded)."""
        if not self.store.has_run(self.run_id):
            return {}
        return {s: (w, f) for s, (_, w, f) in self.store.read_shards(self.run_id, decoder=lambda doc: None).items()}

    def quarantine(self, bad_workers: set[str], edited: Iterable[str], stored: dict[int, tuple[str, str]]) -> list[str]:
        """Move aside every stored file of ``bad_workers`` and the ``edited`` files; the edited, as shown."""
        files = {f for w, f in stored.values() if w in bad_workers}
        for path in sorted(files):
            self.store.quarantine(self.run_id, path, f"produced by {sorted(bad_workers)}; failed verification")
        edited = set(edited)
        for path in sorted(edited - files):
            self.store.quarantine(self.run_id, path, "holds a shard that differs from its recomputation; "
                                  "failed verification")
        return sorted(self.store.display(f) for f in edited)

    # -- at the end ---------------------------------------------------------------------------------
    def write_result(self, summary: dict) -> None:
        """Write (or replace) the run's ``result.json``."""
        self.store.write_result(self.run_id, summary)

    def __repr__(self) -> str:
        return f"HeldRun({self.store!r}, {self.run_id[:12]!r}, held={self.lease.held})"
