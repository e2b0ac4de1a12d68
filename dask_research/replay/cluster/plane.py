"""The learner-side handle of an experience plane spread over Dask workers.

:class:`ClusterPlane` registers a :class:`~dask_research.replay.cluster.plugin.ShardPlugin`
(each worker, present and future, gets a shard sized from its memory), keeps a table of the
shards it knows (address, uid, occupancy, sampling mass, lost or live), and offers the
single-process plane's surface: ``batches()`` (cluster delivery, see
:mod:`~dask_research.replay.cluster.delivery`), ``sample()``, ``update_priorities()``,
``stats()``, ``checkpoint()``, plus ``rebalance()`` (placement across workers, see
:mod:`~dask_research.replay.cluster.placement`).

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
>>> plane = replay.ClusterPlane(client, {"obs": ((4,), "float32"), "reward": ((), "float32")},
...                             capacity_per_worker=100_000,
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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ... import config
from ...exceptions import InputError
from ..batch import Batch
from ..plane import EmptyPlaneError
from ..samplers import Sampler, UniformSampler
from ..spec import ExperienceSpec, priority_arrays
from . import shard_ops
from .delivery import ClusterBatchIterator, assemble, wait_all
from .indices import MAX_SHARDS, decode
from .placement import plan_moves
from .plugin import ShardPlugin, plugin_name
from .shard import ShardsLostError

logger = logging.getLogger(__name__)


@dataclass
class ShardRef:
    """What the learner knows about one shard (a row of ``stats()["shards"]``)."""

    id: int
    address: str
    uid: str
    size: int = 0
    capacity: int = 0
    inserted: int = 0
    mass: float = 0.0
    min_leaf: float = float("nan")
    lost: bool = False
    lost_at: float | None = None
    lost_size: int = 0
    lost_reason: str = ""
    checkpoint: dict | None = None
    restored_to: int | None = None
    sampled: int = 0
    updates_sent: int = 0
    seen: float = field(default_factory=time.time)

    info_time: float = 0.0

    def update(self, info: Mapping[str, Any]) -> None:
        """Take a shard's ``info`` unless an older one arrives late (prefetched replies)."""
        if info["time"] < self.info_time:
            return
        self.info_time = info["time"]
        for k in ("size", "capacity", "inserted", "mass", "min_leaf"):
            setattr(self, k, info[k])
        self.seen = time.time()


def _scheduler_bandwidth(dask_scheduler: Any = None) -> dict[str, Any]:
    """Dask's measured bandwidths: overall and per worker (mean over its peers)."""
    per: dict[str, list[float]] = {}
    for (a, b), bw in dict(dask_scheduler.bandwidth_workers).items():
        per.setdefault(a, []).append(bw)
        per.setdefault(b, []).append(bw)
    return {"total": float(dask_scheduler.bandwidth),
            "workers": {k: float(np.mean(v)) for k, v in per.items()}}


class ClusterPlane:
    """An experience plane whose shards live on Dask workers; the learner's handle.

    Parameters
    ----------
    client : distributed.Client, optional
        A synchronous client (default: the current default client).
    spec : ExperienceSpec or mapping of name -> (shape, dtype)
    capacity_per_worker : int, optional
        Transitions per shard; default from each worker's memory limit
        (``research.replay.cluster.memory-fraction``).
    sampler : Sampler, optional
        Default :class:`UniformSampler`; every shard gets its own copy.
    name : str, optional
        The plane's name on the workers (default: a fresh unique name). A second
        ``ClusterPlane`` with the same name attaches to the existing shards.
    seed : int, optional
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

    def __init__(self, client: Any = None, spec: ExperienceSpec | Mapping[str, Any] | None = None,
                 capacity_per_worker: int | None = None, sampler: Sampler | None = None,
                 name: str | None = None, seed: int | None = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 checkpoint_interval: float | None = None, restore: str = "auto",
                 rebalance_interval: float | None = None, memory_fraction: float | None = None,
                 device_fraction: float | None = None, publish_interval: float | None = None):
        if client is None:
            from distributed import default_client

            client = default_client()
        if getattr(client, "asynchronous", False):
            raise InputError("client", client, "a synchronous distributed.Client (the plane "
                             "runs its delivery in a background thread)", where="ClusterPlane")
        if spec is None:
            raise InputError("spec", None, "a mapping of field -> (shape, dtype), e.g. "
                             "ClusterPlane(client, {'obs': ((4,), 'float32')})",
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
        self.checkpoint_dir = None if checkpoint_dir is None else str(checkpoint_dir)
        self.restore_mode = restore
        self.refresh_interval = float(config.get("replay.cluster.refresh-interval"))
        ri = config.get("replay.cluster.rebalance-interval", rebalance_interval, default=None)
        self.rebalance_interval = None if ri is None else float(ri)
        self.plugin = ShardPlugin(
            self.name, self.spec, capacity_per_worker=capacity_per_worker, sampler=self.sampler,
            memory_fraction=float(config.get("replay.cluster.memory-fraction", memory_fraction)),
            device_fraction=float(config.get("replay.cluster.device-fraction", device_fraction)),
            seed=seed, checkpoint_dir=self.checkpoint_dir, checkpoint_interval=checkpoint_interval)
        self.rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self._shards: dict[int, ShardRef] = {}
        self._by_addr: dict[str, int] = {}
        self._next_id = 0
        self._updates: list[tuple[np.ndarray, np.ndarray]] = []
        self._update_futures: list[Any] = []
        self._move_futures: list[Any] = []
        self._counters = {"updates_queued": 0, "updates_dropped_lost": 0, "updates_applied": 0,
                          "moved": 0, "rebalances": 0, "restored": 0, "sampled": 0}
        self._bw: dict[str, Any] = {"total": float("nan"), "workers": {}}
        self._last_refresh = 0.0
        self._last_ship = 0.0
        self.update_interval = float(config.get("replay.cluster.update-interval"))
        self._last_rebalance = time.monotonic()
        self._t0 = time.monotonic()
        self._deliveries: list[ClusterBatchIterator] = []
        self._worker = self._current_worker()
        self.topic = str(config.get("replay.event-topic"))
        client.register_plugin(self.plugin)
        self.refresh()
        from ..publish import auto_publisher

        self._publisher = auto_publisher(self, client, self.name, publish_interval)

    # --- shard table ---------------------------------------------------------------------
    @staticmethod
    def _current_worker() -> Any:
        try:
            from distributed import get_worker

            return get_worker()
        except ValueError:
            return None

    def _is_local(self, ref: ShardRef) -> bool:
        return self._worker is not None and ref.address == self._worker.address

    def _local_shard(self) -> Any:
        from .plugin import local_shard

        return local_shard(self.name, self._worker)

    def _emit(self, kind: str, **data: Any) -> None:
        msg = {"event": kind, "plane": self.name, **data}
        try:
            self.client.log_event(self.topic, msg)
        except Exception as e:  # pragma: no cover - a scheduler going away
            logger.debug("could not log %s event: %s", kind, e)

    def refresh(self) -> None:
        """Re-read the shard table from the workers; mark shards of departed workers lost."""
        infos = self.client.run(shard_ops.info, self.name, on_error="return")
        try:
            self._bw = self.client.run_on_scheduler(_scheduler_bandwidth)
        except Exception:  # pragma: no cover - a scheduler without dask_research importable
            pass
        now = time.monotonic()
        new: list[ShardRef] = []
        with self._lock:
            self._last_refresh = now
            live = set()
            for addr, info in infos.items():
                if isinstance(info, BaseException):
                    continue
                sid = self._by_addr.get(addr)
                if sid is not None and self._shards[sid].uid == info["uid"]:
                    self._shards[sid].update(info)
                    live.add(sid)
                    continue
                if sid is not None:                     # same address, a new shard
                    self._lose(sid, "replaced")
                if self._next_id >= MAX_SHARDS:  # pragma: no cover
                    raise InputError("shards", self._next_id, f"fewer than {MAX_SHARDS}",
                                     where=f"ClusterPlane {self.name!r}")
                ref = ShardRef(self._next_id, addr, info["uid"])
                ref.update(info)
                self._shards[ref.id] = ref
                self._by_addr[addr] = ref.id
                self._next_id += 1
                live.add(ref.id)
                new.append(ref)
            for sid, ref in list(self._shards.items()):
                if not ref.lost and sid not in live:
                    self._lose(sid, "worker left")
        for ref in new:
            self._emit("shard-new", shard=ref.id, worker=ref.address, capacity=ref.capacity,
                       restored=ref.size > 0)
        if self.restore_mode == "auto" and self.checkpoint_dir:
            self._auto_restore()

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh()
            if (self.rebalance_interval is not None
                    and time.monotonic() - self._last_rebalance >= self.rebalance_interval):
                self.rebalance(wait=False)

    def _lose(self, sid: int, reason: str) -> None:
        with self._lock:
            ref = self._shards[sid]
            if ref.lost:
                return
            ref.lost, ref.lost_at, ref.lost_size = True, time.time(), ref.size
            ref.lost_reason = reason
            ref.mass, ref.size = 0.0, 0
            if self._by_addr.get(ref.address) == sid:
                del self._by_addr[ref.address]
            ref.checkpoint = self._find_checkpoint(ref.uid)
        kept = ref.checkpoint["size"] if ref.checkpoint else 0
        logger.warning("replay plane %r: shard %d on %s lost (%s): %d transitions, %d in its "
                       "last checkpoint", self.name, sid, ref.address, reason, ref.lost_size, kept)
        self._emit("shard-lost", shard=sid, worker=ref.address, reason=reason,
                   size=ref.lost_size, checkpointed=kept)

    def _on_shard_error(self, sid: int, fut: Any) -> None:
        """A sample task failed: find out whether its worker is gone."""
        self.refresh()
        ref = self._shards[sid]
        if not ref.lost and fut.status == "error":
            exc = fut.exception(timeout=5)
            if isinstance(exc, EmptyPlaneError):
                ref.size, ref.mass = 0, 0.0
                return
            raise exc

    def _find_checkpoint(self, uid: str) -> dict | None:
        """What the committed checkpoint of shard ``uid`` holds (None without one)."""
        if not self.checkpoint_dir:
            return None
        from ...exceptions import CheckpointError
        from ..checkpoints import read_meta
        from .shard import checkpoint_info

        p = os.path.join(self.checkpoint_dir, self.name, uid)
        try:
            meta, version = read_meta(p)
            return checkpoint_info(meta, p, version)
        except (CheckpointError, OSError, KeyError, TypeError, ValueError) as e:
            # none committed (the shard died before its first checkpoint finished) or unusable;
            # called on every refresh while the shard is lost, so not a warning each time
            logger.debug("replay plane %r: no usable checkpoint of shard %s: %s",
                         self.name, uid[:8], e)
            return None

    # --- allocation ----------------------------------------------------------------------
    def _live(self) -> list[ShardRef]:
        return [r for r in self._shards.values() if not r.lost and r.mass > 0]

    def _nothing_to_sample(self) -> Exception:
        """:class:`ShardsLostError` when every known shard is lost (raised at once: no
        worker is left to ingest into), else :class:`EmptyPlaneError` (actors may still come)."""
        with self._lock:
            refs = list(self._shards.values())
            if not refs or not all(r.lost for r in refs):
                return EmptyPlaneError()
            lost = [{"id": r.id, "worker": r.address, "reason": r.lost_reason or "lost",
                     "size": int(r.lost_size),
                     "checkpointed": int(r.checkpoint["size"]) if r.checkpoint else 0}
                    for r in refs if r.restored_to is None]    # restored: counted where it went
        return ShardsLostError(self.name, lost)

    def _allocate(self, n: int) -> dict[int, int]:
        """Split a batch of ``n`` over the live shards by their sampling mass (multinomial)."""
        with self._lock:
            live = self._live()
            if not live:
                raise self._nothing_to_sample()
            mass = np.array([r.mass for r in live], dtype=np.float64)
            counts = self.rng.multinomial(n, mass / mass.sum())
        return {r.id: int(c) for r, c in zip(live, counts) if c}

    def _remote_share(self) -> float:
        with self._lock:
            live = self._live()
            tot = sum(r.mass for r in live)
            if not tot:
                return 1.0
            return sum(r.mass for r in live if not self._is_local(r)) / tot

    def _bandwidth(self) -> float:
        """Dask's measured bandwidth to the shards' workers (bytes/s; their mean)."""
        with self._lock:
            per = self._bw.get("workers", {})
            vals = [per[r.address] for r in self._live() if r.address in per]
        if vals:
            return float(np.mean(vals))
        tot = self._bw.get("total", float("nan"))
        return float(tot) if tot == tot else 100e6

    def _sample_future(self, ref: ShardRef, n: int) -> Any:
        return self.client.submit(shard_ops.sample, self.name, n, ref.uid, pure=False,
                                  workers=[ref.address], allow_other_workers=False,
                                  key=f"replay-sample-{self.name}-{uuid.uuid4().hex}")

    def _assemble(self, replies: list[tuple[int, dict]], batch_size: int) -> Batch | None:
        ok = []
        with self._lock:
            for sid, r in replies:
                ref = self._shards[sid]
                if r["records"] is None:            # the shard there was replaced
                    self._lose(sid, "replaced")
                    return None
                ref.update(r["info"])
                ref.sampled += len(r["keys"])
                ok.append((sid, r))
            self._counters["sampled"] += batch_size
            beta = self.sampler.beta if self.sampler.prioritized else None
            leaves = [r.min_leaf for r in self._shards.values()
                      if beta is not None and not r.lost and r.size and r.min_leaf == r.min_leaf]
            min_leaf = float(min(leaves)) if leaves else 1.0
        return assemble(self.spec, ok, beta, min_leaf)

    # --- public surface ------------------------------------------------------------------
    def __len__(self) -> int:
        with self._lock:
            return sum(r.size for r in self._shards.values() if not r.lost)

    @property
    def shards(self) -> list[ShardRef]:
        """Every shard the plane knows, live and lost."""
        with self._lock:
            return list(self._shards.values())

    def ingest(self, batch: Mapping[str, Any], worker: str | None = None) -> int:
        """Ingest from the client into the shard on ``worker`` (default: the emptiest shard).

        Actors on workers should use ``replay.cluster.local_shard(plane.name).ingest(...)``
        instead (no network). Returns the number of transitions ingested.
        """
        fields, n = self.spec.validate(batch)
        with self._lock:
            if worker is None:
                live = [r for r in self._shards.values() if not r.lost]
                if not live:
                    raise self._nothing_to_sample()
                worker = min(live, key=lambda r: r.size / max(r.capacity, 1)).address
            sid = self._by_addr.get(worker)
        if sid is None:
            raise InputError("worker", worker, f"the address of a worker holding a shard "
                             f"({sorted(self._by_addr)})", where="ClusterPlane.ingest")
        info = self.client.submit(shard_ops.ingest, self.name, fields, workers=[worker],
                                  allow_other_workers=False, pure=False).result()
        with self._lock:
            self._shards[sid].update(info)
        return n

    def sample(self, batch_size: int | None = None) -> Batch:
        """One batch now, synchronously (no prefetch), drawn across shards like ``batches``.

        Raises :class:`ShardsLostError` at once when every shard is lost, and
        :class:`EmptyPlaneError` when the live shards hold nothing yet.
        """
        batch_size = int(config.get("replay.batch-size", batch_size))
        stall = float(config.get("replay.cluster.stall"))
        for _ in range(3):
            counts = self._allocate(batch_size)
            futs = {sid: self._sample_future(self._shards[sid], n) for sid, n in counts.items()
                    if not self._is_local(self._shards[sid])}
            replies = []
            try:
                # a task pinned to a dead worker never finishes: re-check the workers every
                # ``stall`` seconds instead of waiting for it
                while not wait_all(list(futs.values()), stall):
                    self.refresh()
                    if any(self._shards[sid].lost for sid in futs):
                        raise LookupError("a shard of this batch was lost")
                for sid, f in futs.items():
                    replies.append((sid, f.result(timeout=stall)))
            except Exception:
                for f in futs.values():
                    f.cancel()
                self.refresh()
                continue
            for sid, n in counts.items():
                if sid not in futs:
                    replies.append((sid, self._local_shard().sample(n)))
            b = self._assemble(replies, batch_size)
            if b is not None:
                return b
            self.refresh()
        raise self._nothing_to_sample()

    def batches(self, batch_size: int | None = None, prefetch: int | None = None,
                to: str = "numpy", device: Any = None, max_batches: int | None = None,
                max_in_flight: int | None = None) -> ClusterBatchIterator:
        """Batches drawn across all live shards, fetched ahead as Dask futures.

        See :mod:`dask_research.replay.cluster.delivery` for the allocation, the prefetch
        (bandwidth) rule and fault handling. ``to``/``device`` as in
        :meth:`ExperiencePlane.batches`.
        """
        from ..delivery import tensordict_output

        wrap, to = tensordict_output(to)
        it = ClusterBatchIterator(self, batch_size=batch_size, prefetch=prefetch, to=to,
                                  device=device, max_batches=max_batches,
                                  max_in_flight=max_in_flight)
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
        with self._lock:
            self._updates.append((idx.copy(), pr.copy()))
            self._counters["updates_queued"] += len(idx)
        if not any(not d.closed for d in self._deliveries):
            self._ship_updates()
        return len(idx)

    def _ship_updates(self, force: bool = True) -> None:
        with self._lock:
            if not self._updates:
                return
            now = time.monotonic()
            if not force and now - self._last_ship < self.update_interval:
                return
            self._last_ship = now
            ups, self._updates = self._updates, []
            idx = np.concatenate([u[0] for u in ups])
            pr = np.concatenate([u[1] for u in ups])
            sids, keys = decode(idx)
            keep = []
            for f in self._update_futures:
                if f.status == "pending":
                    keep.append(f)
                elif f.status == "finished":
                    self._counters["updates_applied"] += f.result()
            self._update_futures = keep
            jobs = []
            for sid in np.unique(sids):
                m = sids == sid
                ref = self._shards.get(int(sid))
                if ref is None or ref.lost:
                    self._counters["updates_dropped_lost"] += int(m.sum())
                    continue
                ref.updates_sent += int(m.sum())
                jobs.append((ref, keys[m], pr[m]))
        for ref, k, p in jobs:
            if self._is_local(ref):
                self._counters["updates_applied"] += self._local_shard().update(ref.uid, k, p)
                continue
            self._update_futures.append(self.client.submit(
                shard_ops.update_priorities, self.name, ref.uid, k, p, workers=[ref.address],
                allow_other_workers=False, pure=False,
                key=f"replay-update-{self.name}-{uuid.uuid4().hex}"))

    def flush(self, timeout: float = 60) -> int:
        """Ship queued priority updates and wait until they are applied; returns how many
        were applied (stale keys and lost shards excluded)."""
        self._ship_updates()
        futs, self._update_futures = self._update_futures, []
        if futs:
            wait_all(futs, timeout)
        applied = sum(f.result() for f in futs if f.status == "finished")
        self._counters["updates_applied"] += applied
        return applied

    # --- placement across workers --------------------------------------------------------
    def rebalance(self, high: float | None = None, low: float | None = None,
                  max_move: int | None = None, wait: bool = True) -> int:
        """Move the oldest transitions of full shards to nearly empty ones (worker to worker).

        See :func:`~dask_research.replay.cluster.placement.plan_moves`. Returns how many
        transitions moved (with ``wait=False``: how many were scheduled to move).
        """
        high = float(config.get("replay.cluster.rebalance-high", high))
        low = float(config.get("replay.cluster.rebalance-low", low))
        max_move = int(config.get("replay.cluster.rebalance-max-move", max_move))
        self._last_rebalance = time.monotonic()
        with self._lock:
            if any(m[-1].status == "pending" for m in self._move_futures):
                return 0                  # the table is stale until those moves are done
            self._move_futures = []
            occ = {r.id: (r.size, r.capacity) for r in self._shards.values() if not r.lost}
            moves = plan_moves(occ, high=high, low=low, max_move=max_move)
            refs = {sid: self._shards[sid] for sid in occ}
        futs = []
        for src, dst, n in moves:
            a, b = refs[src], refs[dst]
            ev = self.client.submit(shard_ops.evict_oldest, self.name, n, workers=[a.address],
                                    allow_other_workers=False, pure=False)
            acc = self.client.submit(shard_ops.accept, self.name, ev, workers=[b.address],
                                     allow_other_workers=False, pure=False)
            futs.append((src, dst, n, ev, acc))
        if not wait:                  # keep the futures alive until they are done
            with self._lock:
                self._move_futures = [m for m in self._move_futures
                                      if m[-1].status == "pending"] + futs
                self._counters["rebalances"] += bool(moves)
            if moves:
                self._emit("rebalance", moves=[[int(s), int(d), int(n)] for s, d, n in moves],
                           moved=None)
            return sum(n for _, _, n in moves)
        moved = 0
        for src, dst, n, ev, acc in futs:
            try:
                info = acc.result(timeout=120)
            except Exception as e:  # a worker died mid-move: those transitions are lost
                logger.warning("replay plane %r: move %d -> %d failed: %s", self.name, src, dst, e)
                continue
            moved += n
            with self._lock:
                self._shards[dst].update(info)
                self._shards[src].size = max(0, self._shards[src].size - n)
        if moves:
            self._counters["rebalances"] += 1
            self._counters["moved"] += moved
            self._emit("rebalance", moves=[[int(s), int(d), int(n)] for s, d, n in moves],
                       moved=moved)
            self.refresh()
        return moved

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
        with self._lock:
            for addr, meta in out.items():
                sid = self._by_addr.get(addr)
                if sid is not None and not isinstance(meta, BaseException):
                    res[sid] = meta
        return res

    def restore_lost(self, shard_id: int, worker: str) -> int:
        """Restore lost shard ``shard_id`` from its last checkpoint onto ``worker``'s empty
        shard; returns the transitions restored."""
        ref = self._shards[shard_id]
        ck = ref.checkpoint or self._find_checkpoint(ref.uid)
        if not ref.lost or ck is None:
            raise InputError("shard_id", shard_id, "a lost shard with a checkpoint",
                             where="ClusterPlane.restore_lost")
        info = self.client.submit(shard_ops.restore, self.name, ck["path"], workers=[worker],
                                  allow_other_workers=False, pure=False).result()
        with self._lock:
            ref.restored_to = self._by_addr.get(worker)
            if ref.restored_to is not None:
                self._shards[ref.restored_to].update(info)
            self._counters["restored"] += info["size"]
        self._emit("shard-restored", shard=shard_id, onto=ref.restored_to, worker=worker,
                   size=info["size"])
        return int(info["size"])

    def _auto_restore(self) -> None:
        with self._lock:
            todo = [r for r in self._shards.values() if r.lost and r.restored_to is None
                    and (r.checkpoint or self._find_checkpoint(r.uid))]
            empty = [r for r in self._shards.values() if not r.lost and r.size == 0
                     and r.inserted == 0]
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
        with self._lock:
            shards = [asdict(r) for r in self._shards.values()]
            live = [r for r in self._shards.values() if not r.lost]
            cnt = dict(self._counters)
            span = time.monotonic() - self._t0
        out: dict[str, Any] = {
            "name": self.name, "size": sum(r.size for r in live),
            "capacity": sum(r.capacity for r in live), "inserted": sum(r.inserted for r in live),
            "live_shards": len(live), "shards": shards,
            "lost_shards": [s for s in shards if s["lost"]],
            "lost_transitions": sum(s["lost_size"] for s in shards if s["lost"]),
            "bandwidth": self._bandwidth(),
            "rates": {"sample_rate": cnt["sampled"] / span if span > 0 else float("nan"),
                      "insert_rate": (sum(r.inserted for r in self._shards.values()) / span
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
        live = sum(not r.lost for r in self._shards.values())
        return f"ClusterPlane({self.name!r}, shards={live}, size={len(self):,})"
