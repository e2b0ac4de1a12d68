"""The learner-side handle of an experience plane spread over Dask workers.

:class:`ClusterPlane` registers a :class:`~dask_research.replay.cluster.plugin.ShardPlugin`
(each worker, present and future, gets a shard sized from its memory), keeps a table of the
shards it knows (address, uid, occupancy, sampling mass, lost or live), and offers the
single-process plane's surface: ``batches()`` (cluster delivery, see
:mod:`~dask_research.replay.cluster.cluster_delivery`), ``sample()``, ``update_priorities()``,
``stats()``, ``checkpoint()``, plus ``rebalance()`` (placement across workers, see
:mod:`~dask_research.replay.cluster.shard_moves`).

The plane is a facade over its collaborators: the shard table
(:mod:`~dask_research.replay.cluster.table`: refs, refresh, loss, allocation, sample tasks,
assembly), the priority router (:mod:`~dask_research.replay.cluster.router`) and the event log
(:mod:`~dask_research.replay.cluster.eventlog`); delivery is handed the table and the router.

Actors run as Dask tasks and ingest into the shard of the worker they run on::

    def actor(plane_name, ...):
        shard = replay.cluster.local_shard(plane_name)     # this worker's shard
        ...
        shard.ingest(transitions)

Lost shards: when a worker holding a shard leaves, the next refresh (at most
``research.replay.cluster.refresh-interval`` seconds later, or at once when a sample task
fails) marks its shard lost, logs a ``shard-lost`` event on ``research.replay.event-topic``
and delivery continues from the others; only that shard's experience since its last
checkpoint is gone. With ``checkpoint_dir``, shards checkpoint every ``checkpoint_interval``
seconds, and a lost shard is restored onto the first empty shard of a new worker
(``restore="auto"``) or by :meth:`ClusterPlane.restore_lost`.

Examples
--------
>>> from distributed import Client
>>> from dask_research import replay
>>> client = Client(n_workers=2, threads_per_worker=2)               # doctest: +SKIP
>>> plane = replay.ClusterPlane({"obs": ((4,), "float32"), "reward": ((), "float32")},
...                             client=client, capacity_per_worker=100_000,
...                             sampler=replay.PrioritizedSampler(0.6, 0.4))  # doctest: +SKIP
>>> client.submit(my_actor, plane.name, pure=False)                  # doctest: +SKIP
>>> for batch in plane.batches(batch_size=256, max_batches=1000):    # doctest: +SKIP
...     plane.update_priorities(batch.indices, td_error(batch))
>>> plane.stats()["shards"]                                          # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from ... import config, events
from ...exceptions import InputError
from ...seeds import seed_int
from ..batch import Batch
from ..samplers import Sampler, UniformSampler
from ..spec import ExperienceSpec, priority_arrays
from . import shard_ops
from .cluster_delivery import ClusterBatchIterator
from .eventlog import PlaneEvents
from .plugin import ShardPlugin, plugin_name
from .router import PriorityRouter
from .shard_moves import plan_moves
from .table import ShardRef, ShardTable
from .waiting import wait_all

logger = logging.getLogger(__name__)


def _old_call_form(spec: Any, args: tuple, client: Any, capacity: Any) -> tuple[Any, Any, Any]:
    """``ClusterPlane(spec, client=client, capacity_per_worker)``, the order before ``client=`` was a
    keyword like everywhere else: still accepted, with a DeprecationWarning."""
    from distributed import Client

    if isinstance(spec, Client):
        warnings.warn("ClusterPlane(spec, client=client, ...) is deprecated: pass ClusterPlane(spec, client=client, ...)",
                      DeprecationWarning, stacklevel=3)
        client, spec = spec, (args[0] if args else None)
        args = args[1:]
    if args:
        if len(args) > 1 or capacity is not None:
            raise TypeError("ClusterPlane takes the spec by position; pass everything else by keyword")
        capacity = args[0]
    return spec, client, capacity


class ClusterPlane:
    """An experience plane whose shards live on Dask workers; the learner's handle.

    Parameters
    ----------
    spec : ExperienceSpec or mapping of name -> (shape, dtype)
        The fields of a transition.
    client : distributed.Client, optional
        A synchronous client (default: the current default client, as every entry point of
        the package takes it: keyword ``client=``). The form before, ``ClusterPlane(client,
        spec, ...)``, still works, with a ``DeprecationWarning``.
    capacity_per_worker : int, optional
        Transitions per shard; default from each worker's memory limit
        (``research.replay.cluster.memory-fraction``).
    sampler : Sampler, optional
        Default :class:`UniformSampler`; every shard gets its own copy.
    name : str, optional
        The plane's name on the workers (default: a fresh unique name). A second
        ``ClusterPlane`` with the same name attaches to the existing shards.
    seed : int, SeedSequence or Generator, optional
        Seeds the learner's allocation draws and, with the worker address, each shard.
    checkpoint_dir : str, optional
        Where shards write checkpoints (a path all workers can reach).
    checkpoint_interval : float, optional
        Seconds between periodic shard checkpoints (needs ``checkpoint_dir``).
    restore : {"auto", "manual"}
        Restore a lost shard's checkpoint onto a new empty shard automatically, or only via
        :meth:`restore_lost`.
    rebalance_interval : float, optional
        Seconds between automatic :meth:`rebalance` rounds while batches are delivered
        (default ``research.replay.cluster.rebalance-interval``; None: manual only).
    memory_fraction, device_fraction : float, optional
        Shard sizing on each worker (see :class:`ShardPlugin`).
    publish_interval : float, optional
        Seconds between the ``stats`` events the plane logs for the dashboard's Experience page
        (numbers only; default ``research.replay.publish-interval``; 0, or ``null`` there: never).
    """

    def __init__(self, spec: ExperienceSpec | Mapping[str, Any] | None = None, *args: Any, client: Any = None,
                 capacity_per_worker: int | None = None, sampler: Sampler | None = None,
                 name: str | None = None, seed: Any = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 checkpoint_interval: float | None = None, restore: str = "auto",
                 rebalance_interval: float | None = None, memory_fraction: float | None = None,
                 device_fraction: float | None = None, publish_interval: float | None = None):
        spec, client, capacity_per_worker = _old_call_form(spec, args, client, capacity_per_worker)
        if client is None:
            from distributed import default_client

            try:
                client = default_client()
            except ValueError:      # Dask's several lines: "No clients found ..."
                raise InputError("client", None, "a distributed.Client connected to the cluster the shards "
                                 "live on: ClusterPlane(spec, client=Client(...)), or a default client "
                                 "(one made without set_as_default=False)", where="ClusterPlane") from None
        if getattr(client, "asynchronous", False):
            raise InputError("client", client, "a synchronous distributed.Client (the plane "
                             "runs its delivery in a background thread)", where="ClusterPlane")
        if spec is None:
            raise InputError("spec", None, "a mapping of field -> (shape, dtype), e.g. "
                             "ClusterPlane({'obs': ((4,), 'float32')}, client=client)",
                             where="ClusterPlane")
        if restore not in ("auto", "manual"):
            raise InputError("restore", restore, "'auto' or 'manual'", where="ClusterPlane")
        self.client = client
        self.spec = spec if isinstance(spec, ExperienceSpec) else ExperienceSpec(spec)
        self.sampler = sampler if sampler is not None else UniformSampler()
        if not isinstance(self.sampler, Sampler):
            raise InputError("sampler", sampler, "a Sampler (UniformSampler(), "
                             "PrioritizedSampler(alpha, beta), RecentSampler(window))",
                             where="ClusterPlane")
        self.name = name or f"plane-{uuid.uuid4().hex[:8]}"
        seed = seed_int(seed, where="ClusterPlane")   # one number: each shard seeds from (seed, its worker)
        self.checkpoint_dir = None if checkpoint_dir is None else str(checkpoint_dir)
        self.restore_mode = restore
        self.refresh_interval = float(config.resolve("replay.cluster.refresh-interval"))
        ri = config.resolve("replay.cluster.rebalance-interval", rebalance_interval, default=None)
        self.rebalance_interval = None if ri is None else float(ri)
        self.plugin = ShardPlugin(
            self.name, self.spec, capacity_per_worker=capacity_per_worker, sampler=self.sampler,
            memory_fraction=float(config.resolve("replay.cluster.memory-fraction", memory_fraction)),
            device_fraction=float(config.resolve("replay.cluster.device-fraction", device_fraction)),
            seed=seed, checkpoint_dir=self.checkpoint_dir, checkpoint_interval=checkpoint_interval)
        self.topic = events.topic("replay")
        self.update_interval = float(config.resolve("replay.cluster.update-interval"))
        self.events = PlaneEvents(client, self.name, self.topic)
        self.table = ShardTable(client, self.name, self.spec, self.sampler, self.events,
                                seed=seed, checkpoint_dir=self.checkpoint_dir,
                                refresh_interval=self.refresh_interval,
                                on_refresh=self._auto_restore)
        self.router = PriorityRouter(client, self.name, self.table, self.update_interval)
        self._lock = threading.RLock()           # moves and counters; taken before table.lock
        self._move_futures: list[Any] = []
        self._counters = {"moved": 0, "rebalances": 0, "restored": 0}
        self._last_rebalance = time.monotonic()
        self._t0 = time.monotonic()
        self._deliveries: list[ClusterBatchIterator] = []
        client.register_plugin(self.plugin)
        self.refresh()
        from ..stats_publisher import auto_publisher

        self._publisher = auto_publisher(self, client, self.name, publish_interval)

    # --- shard table ---------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the shard table from the workers; mark shards of departed workers lost."""
        self.table.refresh()

    def _upkeep(self) -> None:
        """Delivery's periodic work: refresh the shard table and, when due, rebalance."""
        if (self.table.maybe_refresh() and self.rebalance_interval is not None
                and time.monotonic() - self._last_rebalance >= self.rebalance_interval):
            self.rebalance(wait=False)

    def __len__(self) -> int:
        return self.table.size()

    @property
    def shards(self) -> list[ShardRef]:
        """Every shard the plane knows, live and lost."""
        return self.table.refs()

    # --- experience in and out -----------------------------------------------------------
    def ingest(self, batch: Mapping[str, Any], worker: str | None = None) -> int:
        """Ingest from the client into the shard on ``worker`` (default: the emptiest shard).

        Actors on workers should use ``replay.cluster.local_shard(plane.name).ingest(...)``
        instead (no network). Returns the number of transitions ingested.
        """
        fields, n = self.spec.validate(batch)
        table = self.table
        with table.lock:
            if worker is None:
                live = [r for r in table.refs() if r.usable]
                if not live:
                    raise table.nothing_to_sample()
                worker = min(live, key=lambda r: r.size / max(r.capacity, 1)).address
            sid = table.id_of(worker)
        if sid is None:
            raise InputError("worker", worker, f"the address of a worker holding a shard "
                             f"({table.addresses()})", where="ClusterPlane.ingest")
        info = self.client.submit(shard_ops.ingest, self.name, fields, workers=[worker],
                                  allow_other_workers=False, pure=False).result()
        with table.lock:
            table[sid].update(info)
        return n

    def sample(self, batch_size: int | None = None) -> Batch:
        """One batch now, synchronously (no prefetch), drawn across shards like ``batches``.

        Raises :class:`ShardsLostError` at once when every shard is lost, and
        :class:`EmptyPlaneError` when the live shards hold nothing yet.
        """
        batch_size = int(config.resolve("replay.batch-size", batch_size))
        stall = float(config.resolve("replay.cluster.stall"))
        table = self.table
        for _ in range(3):
            counts = table.allocate(batch_size)
            futs = {sid: table.sample_future(table[sid], n) for sid, n in counts.items()
                    if not table.is_local(table[sid])}
            replies = []
            try:
                # a task pinned to a dead worker never finishes: re-check the workers every
                # ``stall`` seconds instead of waiting for it
                while not wait_all(list(futs.values()), stall):
                    self.refresh()
                    if not all(table[sid].usable for sid in futs):
                        raise LookupError("a shard of this batch was lost, or its worker is frozen")
                for sid, f in futs.items():
                    replies.append((sid, f.result(timeout=stall)))
            except Exception:
                for f in futs.values():
                    f.cancel()
                self.refresh()
                continue
            for sid, n in counts.items():
                if sid not in futs:
                    replies.append((sid, table.sample_local(n)))
            b = table.assemble(replies, batch_size)
            if b is not None:
                return b
            self.refresh()
        raise table.nothing_to_sample()

    def batches(self, batch_size: int | None = None, prefetch: int | None = None,
                to: str = "numpy", device: Any = None, max_batches: int | None = None,
                max_in_flight: int | None = None) -> ClusterBatchIterator:
        """Batches drawn across all live shards, fetched ahead as Dask futures.

        See :mod:`dask_research.replay.cluster.cluster_delivery` for the allocation, the prefetch
        (bandwidth) rule and fault handling. ``to``/``device`` as in
        :meth:`ExperiencePlane.batches`.
        """
        from ..local_delivery import tensordict_output

        wrap, to = tensordict_output(to)
        it = ClusterBatchIterator(self.table, self.router, batch_size=batch_size,
                                  prefetch=prefetch, to=to, device=device,
                                  max_batches=max_batches, max_in_flight=max_in_flight,
                                  upkeep=self._upkeep)
        self._deliveries = [d for d in self._deliveries if not d.closed][-7:] + [it]
        return wrap(it)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Queue new priorities for ``batch.indices``; they are routed to the owning shards.

        Updates are shipped by the delivery thread (or at once without one, or by
        :meth:`flush`); updates for lost shards are dropped and counted. Returns how many
        were queued.
        """
        idx, pr = priority_arrays(indices, priorities, where="ClusterPlane.update_priorities")
        if not self.sampler.prioritized:
            return 0
        if len(pr) and (not np.isfinite(pr).all() or (pr < 0).any()):
            raise InputError("priorities", float(pr[~(np.isfinite(pr) & (pr >= 0))][0]),
                             "finite numbers >= 0", where="ClusterPlane.update_priorities")
        n = self.router.queue(idx, pr)
        if not any(not d.closed for d in self._deliveries):
            self.router.ship()
        return n

    def flush(self, timeout: float = 60) -> int:
        """Ship queued priority updates and wait until they are applied; returns how many
        were applied (stale keys and lost shards excluded)."""
        return self.router.flush(timeout)

    # --- placement across workers --------------------------------------------------------
    def rebalance(self, high: float | None = None, low: float | None = None,
                  max_move: int | None = None, wait: bool = True) -> int:
        """Move the oldest transitions of full shards to nearly empty ones (worker to worker).

        See :func:`~dask_research.replay.cluster.shard_moves.plan_moves`. Returns how many
        transitions moved (with ``wait=False``: how many were scheduled to move).
        """
        high = float(config.resolve("replay.cluster.rebalance-high", high))
        low = float(config.resolve("replay.cluster.rebalance-low", low))
        max_move = int(config.resolve("replay.cluster.rebalance-max-move", max_move))
        self._last_rebalance = time.monotonic()
        table = self.table
        with self._lock, table.lock:
            for m in self._move_futures:
                if m[-1].status == "pending" and (table[m[0]].lost or table[m[1]].lost):
                    for f in m[-2:]:      # its worker left: the task would wait for it for ever
                        f.cancel()
            if any(m[-1].status == "pending" for m in self._move_futures):
                return 0                  # the table is stale until those moves are done
            self._move_futures = []
            refs = {r.id: r for r in table.refs() if not r.lost}
            occ = {sid: (r.size, r.capacity) for sid, r in refs.items()}
            moves = plan_moves(occ, high=high, low=low, max_move=max_move)
        futs = []
        for src, dst, n in moves:
            a, b = refs[src], refs[dst]
            ev = self.client.submit(shard_ops.evict_oldest, self.name, n, workers=[a.address],
                                    allow_other_workers=False, pure=False)
            acc = self.client.submit(shard_ops.accept, self.name, ev, workers=[b.address],
                                     allow_other_workers=False, pure=False)
            futs.append((src, dst, n, ev, acc))
        planned = [[int(s), int(d), int(n)] for s, d, n in moves]
        if not wait:                  # keep the futures alive until they are done
            with self._lock:
                self._move_futures = [m for m in self._move_futures
                                      if m[-1].status == "pending"] + futs
                self._counters["rebalances"] += bool(moves)
            if moves:
                self.events.emit("rebalance", moves=planned, moved=None)
            return sum(n for _, _, n in moves)
        moved = 0
        for src, dst, n, ev, acc in futs:
            try:
                info = self._move_result(ev, acc, (refs[src].address, refs[dst].address))
            except Exception as e:  # a worker died mid-move: those transitions are lost
                logger.warning("replay plane %r: move %d -> %d failed: %s", self.name, src, dst, e)
                continue
            moved += n
            with table.lock:
                table[dst].update(info)
                table[src].size = max(0, table[src].size - n)
        if moves:
            with self._lock:
                self._counters["rebalances"] += 1
                self._counters["moved"] += moved
            self.events.emit("rebalance", moves=planned, moved=moved)
            self.refresh()
        return moved

    def _move_result(self, ev: Any, acc: Any, workers: tuple[str, str], timeout: float = 120.0) -> Any:
        """The accept task's result; gives up (cancelling the move) as soon as either worker
        has left the scheduler: its task, pinned there, would wait for it for ever."""
        from ..._cluster import workers_info

        deadline = time.monotonic() + timeout
        while True:
            try:
                return acc.result(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                gone = set(workers) - set(workers_info(self.client))
                if gone:
                    ev.cancel()
                    acc.cancel()
                    raise RuntimeError(f"worker {sorted(gone)[0]} left during the move") from None

    # --- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, root: str | os.PathLike | None = None) -> dict[int, dict]:
        """Checkpoint every live shard now (to ``root``, default ``checkpoint_dir``)."""
        root = str(root) if root is not None else self.checkpoint_dir
        if root is None:
            raise InputError("root", None, "a directory all workers can write, or "
                             "ClusterPlane(..., checkpoint_dir=...)",
                             where="ClusterPlane.checkpoint")
        sub = os.path.join(root, self.name)
        out = self.client.run(shard_ops.checkpoint, self.name, sub, on_error="return")
        res = {}
        with self.table.lock:
            for addr, meta in out.items():
                sid = self.table.id_of(addr)
                if sid is not None and not isinstance(meta, BaseException):
                    res[sid] = meta
        return res

    def restore_lost(self, shard_id: int, worker: str) -> int:
        """Restore lost shard ``shard_id`` from its last checkpoint onto ``worker``'s empty
        shard; returns the transitions restored."""
        table = self.table
        ref = table[shard_id]
        ck = ref.checkpoint or table.find_checkpoint(ref.uid)
        if not ref.lost or ck is None:
            raise InputError("shard_id", shard_id, "a lost shard with a checkpoint",
                             where="ClusterPlane.restore_lost")
        info = self.client.submit(shard_ops.restore, self.name, ck["path"], workers=[worker],
                                  allow_other_workers=False, pure=False).result()
        with self._lock, table.lock:
            ref.restored_to = table.id_of(worker)
            if ref.restored_to is not None:
                table[ref.restored_to].update(info)
            self._counters["restored"] += info["size"]
        self.events.emit("shard-restored", shard=shard_id, onto=ref.restored_to, worker=worker,
                         size=info["size"])
        return int(info["size"])

    def _auto_restore(self) -> None:
        """After each refresh with ``restore="auto"``: lost shards onto new empty shards."""
        if self.restore_mode != "auto" or not self.checkpoint_dir:
            return
        table = self.table
        with table.lock:
            refs = table.refs()
            todo = [r for r in refs if r.lost and r.restored_to is None
                    and (r.checkpoint or table.find_checkpoint(r.uid))]
            empty = [r for r in refs if not r.lost and r.size == 0 and r.inserted == 0]
        for lost, target in zip(todo, empty):
            try:
                self.restore_lost(lost.id, target.address)
            except Exception as e:  # pragma: no cover - the next refresh retries
                logger.warning("replay plane %r: restore of shard %d failed: %s", self.name,
                               lost.id, e)

    # --- statistics ----------------------------------------------------------------------
    def stats(self, refresh: bool = True) -> dict[str, Any]:
        """Per-shard occupancy, lost shards, rates, priority-update routing, delivery figures."""
        if refresh:
            self.refresh()
        with self._lock, self.table.lock:
            refs = self.table.refs()
            shards = [asdict(r) for r in refs]
            live = [r for r in refs if not r.lost]
            cnt = {**self.router.counters, **self._counters, **self.table.counters}
            span = time.monotonic() - self._t0
        out: dict[str, Any] = {
            "name": self.name, "size": sum(r.size for r in live),
            "capacity": sum(r.capacity for r in live), "inserted": sum(r.inserted for r in live),
            "live_shards": len(live), "shards": shards,
            "lost_shards": [s for s in shards if s["lost"]],
            "stalled_shards": [s for s in shards if s["stalled"] and not s["lost"]],
            "lost_transitions": sum(s["lost_size"] for s in shards if s["lost"]),
            "bandwidth": self.table.bandwidth(),
            "rates": {"sample_rate": cnt["sampled"] / span if span > 0 else float("nan"),
                      "insert_rate": (sum(r.inserted for r in refs) / span
                                      if span > 0 else float("nan"))},
            **cnt,
        }
        if self._deliveries:
            out["delivery"] = self._deliveries[-1].summary()
        return out

    # --- lifetime ------------------------------------------------------------------------
    def close(self, drop: bool = False) -> None:
        """Stop delivery; with ``drop``, unregister the plugin (the shards are freed)."""
        for d in self._deliveries:
            d.close()
        if self._publisher is not None:
            self._publisher.stop()
        try:
            self.flush(timeout=10)
        except Exception:  # pragma: no cover
            pass
        if drop:
            try:
                self.client.unregister_worker_plugin(plugin_name(self.name))
            except Exception as e:  # pragma: no cover
                logger.debug("could not unregister %s: %s", self.name, e)

    def __enter__(self) -> ClusterPlane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        live = sum(not r.lost for r in self.table.refs())
        return f"ClusterPlane({self.name!r}, shards={live}, size={len(self):,})"
