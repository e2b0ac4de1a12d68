"""The learner's table of a cluster plane's shards, and how one batch is drawn across them.

:class:`ShardTable` holds a :class:`ShardRef` for every shard the plane ever saw (address,
uid, occupancy, sampling mass, lost or live) and does what needs that table:

- **refresh** it from the workers (``shard_ops.info`` on each, each answer awaited at most
  ``answer_within`` seconds) and Dask's measured bandwidths;
- **stall**: a shard whose worker does not answer in time (frozen: SIGSTOP, a VM pause, swap)
  is *stalled*: kept, not sampled, not ingested into, its requests drawn again from the others,
  until its worker answers again (the first refresh after it thaws) or leaves the scheduler
  (then it is lost);
- **loss**: a shard whose worker left, or whose address now holds a new shard
  (``"replaced"``), is marked lost with what its last committed checkpoint holds, and a
  ``shard-lost`` event is logged; a shard id is never reused;
- **allocation**: a batch is split over the live shards by a multinomial draw in proportion
  to their sampling mass; :meth:`ShardTable.sample_future` pins one sample task per remote
  shard to its worker, :meth:`ShardTable.sample_local` draws the learner's own shard in
  process;
- **assembly** of the shards' replies into one :class:`~dask_research.replay.Batch` (global
  indices, importance weights over all shards, see :func:`assemble`).

Delivery, the priority router and :class:`~dask_research.replay.ClusterPlane` use it; it
knows nothing of them (``on_refresh`` is the one hook: the plane's automatic restore).
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import config
from ..._compat import bandwidth_workers, run_each, total_bandwidth
from ...exceptions import InputError
from ..batch import Batch
from ..experience_plane import EmptyPlaneError
from ..samplers import Sampler
from ..spec import ExperienceSpec
from . import shard_ops
from .eventlog import PlaneEvents
from .indices import MAX_SHARDS, encode
from .plugin import local_shard
from .worker_shard import ShardsLostError, WorkerShard

logger = logging.getLogger(__name__)


@dataclass
class ShardRef:
    """What the learner knows about one shard (a row of ``stats()["shards"]``).

    >>> ref = ShardRef(0, "tcp://w:1", "u1")
    >>> ref.update({"time": 2.0, "size": 5, "capacity": 10, "inserted": 5, "mass": 5.0,
    ...             "min_leaf": 1.0})
    >>> ref.update({"time": 1.0, "size": 0, "capacity": 10, "inserted": 0, "mass": 0.0,
    ...             "min_leaf": 1.0})                       # an older reply, arriving late
    >>> ref.size
    5
    """

    id: int
    address: str
    uid: str
    size: int = 0
    capacity: int = 0
    inserted: int = 0
    mass: float = 0.0
    min_leaf: float = float("nan")
    lost: bool = False
    stalled: bool = False
    lost_size: int = 0
    lost_reason: str = ""
    checkpoint: dict | None = None
    restored_to: int | None = None
    sampled: int = 0
    updates_sent: int = 0
    seen: float = field(default_factory=time.time)

    info_time: float = 0.0

    @property
    def usable(self) -> bool:
        """Whether the shard can be sampled and ingested into now: neither lost nor stalled."""
        return not self.lost and not self.stalled

    def update(self, info: Mapping[str, Any]) -> None:
        """Take a shard's ``info`` unless an older one arrives late (prefetched replies)."""
        if info["time"] < self.info_time:
            return
        self.info_time = info["time"]
        for k in ("size", "capacity", "inserted", "mass", "min_leaf"):
            setattr(self, k, info[k])
        self.seen = time.time()


def scheduler_bandwidth(dask_scheduler: Any = None) -> dict[str, Any]:
    """Dask's measured bandwidths: overall and per worker (mean over its peers).

    Runs on the scheduler (``client.run_on_scheduler``).

    >>> class Scheduler:
    ...     bandwidth = 1e8
    ...     bandwidth_workers = {("a", "b"): 2e8, ("a", "c"): 4e8}
    >>> scheduler_bandwidth(Scheduler())["workers"]
    {'a': 300000000.0, 'b': 200000000.0, 'c': 400000000.0}
    """
    per: dict[str, list[float]] = {}
    for (a, b), bw in bandwidth_workers(dask_scheduler).items():
        per.setdefault(a, []).append(bw)
        per.setdefault(b, []).append(bw)
    return {"total": total_bandwidth(dask_scheduler),
            "workers": {k: float(np.mean(v)) for k, v in per.items()}}


def assemble(spec: Any, parts: list[tuple[int, dict]], beta: float | None,
             min_leaf: float) -> Batch:
    """One batch from shard replies ``[(shard_id, reply), ...]`` (global indices, weights).

    A transition's weight is ``(leaf / min_leaf) ** -beta`` (at most 1), ``min_leaf`` the
    smallest priority leaf over all live shards; ``beta=None``: no weights.

    >>> from dask_research.replay import ExperienceSpec
    >>> spec = ExperienceSpec({"x": ((), "float32")})
    >>> reply = {"records": spec.empty(2), "keys": np.array([4, 5]), "leaf": np.array([1., 2.])}
    >>> b = assemble(spec, [(1, reply)], beta=1.0, min_leaf=1.0)
    >>> b.weights.tolist(), b.indices.tolist() == encode(1, np.array([4, 5])).tolist()
    ([1.0, 0.5], True)
    """
    recs = [r["records"] for _, r in parts]
    rec = np.concatenate(recs) if len(recs) > 1 else recs[0]
    idx = np.concatenate([encode(sid, r["keys"]) for sid, r in parts])
    weights = None
    if beta is not None:
        leaf = np.concatenate([r["leaf"] for _, r in parts])
        w = np.divide(min_leaf, leaf, out=np.ones_like(leaf), where=leaf > 0)
        np.minimum(w, 1.0, out=w)
        if beta != 1.0:
            np.power(w, beta, out=w)
        weights = w.astype(np.float32)
    info = {"sample": max((r.get("sample_s", 0.0) for _, r in parts), default=0.0)}
    return Batch({n: rec[n] for n in spec.names}, idx, weights, info)


def current_worker() -> Any:
    """The Dask worker this code runs on, or None (the learner runs in a plain client).

    >>> current_worker() is None
    True
    """
    try:
        from distributed import get_worker

        return get_worker()
    except ValueError:
        return None


class ShardTable:
    """The shards of plane ``name`` as the learner knows them (see the module docstring).

    Parameters
    ----------
    client : distributed.Client
    name : str
        The plane's name on the workers.
    spec : ExperienceSpec or mapping
    sampler : Sampler
        The plane's sampler (its ``beta`` weighs prioritized samples).
    events : PlaneEvents
        Where ``shard-new`` and ``shard-lost`` are logged.
    seed : int, optional
        Seeds the allocation draws.
    checkpoint_dir : str, optional
        Where the shards checkpoint (a lost shard's last checkpoint is looked up there).
    refresh_interval : float
        Seconds between the refreshes :meth:`maybe_refresh` does.
    on_refresh : callable, optional
        Called after every :meth:`refresh` (the plane's automatic restore).
    answer_within : float, optional
        Seconds a refresh waits for a worker's answer before its shard counts as stalled
        (default ``research.replay.cluster.stall``).
    worker : distributed.Worker, optional
        The worker the learner runs on (default: found; None outside a worker).

    Examples
    --------
    >>> from dask_research.replay import UniformSampler
    >>> from dask_research.replay.cluster.eventlog import PlaneEvents
    >>> table = ShardTable(None, "p", {"x": ((2,), "float32")}, UniformSampler(),
    ...                    PlaneEvents(None, "p", "research.replay"), seed=0)
    >>> info = {"uid": "u1", "time": 1.0, "size": 30, "capacity": 100, "inserted": 30,
    ...         "mass": 30.0, "min_leaf": 1.0}
    >>> table.apply({"tcp://w:1": info, "tcp://w:2": {**info, "uid": "u2"}})  # what refresh() read
    >>> [(r.id, r.address, r.size) for r in table.refs()], table.allocate(8)
    ([(0, 'tcp://w:1', 30), (1, 'tcp://w:2', 30)], {0: 5, 1: 3})
    >>> table.apply({"tcp://w:1": {**info, "time": 2.0}}, waiting={"tcp://w:2"})   # w:2 frozen
    >>> table[1].stalled, table[1].lost, table.allocate(8)
    (True, False, {0: 8})
    """

    def __init__(self, client: Any, name: str, spec: ExperienceSpec | Mapping[str, Any],
                 sampler: Sampler, events: PlaneEvents, seed: int | None = None,
                 checkpoint_dir: str | None = None, refresh_interval: float = 1.0,
                 on_refresh: Callable[[], None] | None = None, worker: Any = None,
                 answer_within: float | None = None):
        self.client = client
        self.name = name
        self.spec = spec if isinstance(spec, ExperienceSpec) else ExperienceSpec(spec)
        self.sampler = sampler
        self.events = events
        self.checkpoint_dir = checkpoint_dir
        self.refresh_interval = float(refresh_interval)
        self.on_refresh = on_refresh
        self.answer_within = float(config.resolve("replay.cluster.stall", answer_within))
        self._asked: dict[str, Any] = {}       # workers asked for their info, not answered yet
        self.worker = worker if worker is not None else current_worker()
        self.rng = np.random.default_rng(seed)
        self.lock = threading.RLock()
        self.counters = {"sampled": 0}
        self._shards: dict[int, ShardRef] = {}
        self._by_addr: dict[str, int] = {}
        self._next_id = 0
        self._bw: dict[str, Any] = {"total": float("nan"), "workers": {}}
        self._bw_failed = False                 # warned once that the scheduler gave none
        self._last_refresh: float | None = None  # time.monotonic() of the last refresh; None: never

    # --- the rows ------------------------------------------------------------------------
    def __getitem__(self, sid: int) -> ShardRef:
        return self._shards[sid]

    def get(self, sid: int) -> ShardRef | None:
        """The row of shard ``sid``, or None for an id the plane never gave out."""
        return self._shards.get(sid)

    def refs(self) -> list[ShardRef]:
        """Every shard, live and lost, in the order the plane first saw them."""
        with self.lock:
            return list(self._shards.values())

    def id_of(self, address: str) -> int | None:
        """The id of the shard now on worker ``address`` (None: no live shard there)."""
        with self.lock:
            return self._by_addr.get(address)

    def addresses(self) -> list[str]:
        """The workers holding a live shard, sorted."""
        with self.lock:
            return sorted(self._by_addr)

    def live(self) -> list[ShardRef]:
        """The shards that can be sampled: not lost, with sampling mass."""
        return [r for r in self._shards.values() if r.usable and r.mass > 0]

    def size(self) -> int:
        """Transitions in the live shards."""
        with self.lock:
            return sum(r.size for r in self._shards.values() if not r.lost)

    def is_local(self, ref: ShardRef) -> bool:
        """Whether ``ref`` is the shard of the worker the learner runs on."""
        return self.worker is not None and ref.address == self.worker.address

    def local_shard(self) -> WorkerShard:
        """The learner's own shard (the learner runs on a worker)."""
        return local_shard(self.name, self.worker)

    def sample_local(self, n: int) -> dict[str, Any]:
        """``n`` transitions from the learner's own shard, in process (no task)."""
        return self.local_shard().sample(n)

    # --- refresh and loss ----------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the shard table from the workers; mark shards of departed workers lost and
        of workers that do not answer within ``answer_within`` seconds stalled."""
        infos, waiting = run_each(self.client, shard_ops.info, self.name, within=self.answer_within,
                                  asked=self._asked)
        try:
            self._bw = self.client.run_on_scheduler(scheduler_bandwidth)
        except Exception as e:  # a scheduler without dask_research, or Dask moved an internal
            if not self._bw_failed:
                logger.warning("replay plane %r: no bandwidth measurement from the scheduler "
                               "(%s: %s); the prefetch rule uses %.3g bytes/s", self.name,
                               type(e).__name__, e, self.bandwidth())
            self._bw_failed = True
        self.apply(infos, waiting)

    def apply(self, infos: Mapping[str, Any], waiting: set[str] | frozenset[str] = frozenset()) -> None:
        """Take what a refresh read: ``infos`` (address -> the shard's info, or the exception
        its worker raised) and ``waiting``, the workers that have not answered yet. A shard
        of neither is lost; one of ``waiting`` is stalled until its worker answers."""
        now = time.monotonic()
        new: list[ShardRef] = []
        stalled: list[ShardRef] = []
        resumed: list[ShardRef] = []
        with self.lock:
            self._last_refresh = now
            live = set()
            for addr in waiting:
                sid = self._by_addr.get(addr)
                if sid is not None and not self._shards[sid].lost:
                    live.add(sid)
                    if not self._shards[sid].stalled:
                        self._shards[sid].stalled = True
                        stalled.append(self._shards[sid])
            for addr, info in infos.items():
                if isinstance(info, BaseException):
                    continue
                sid = self._by_addr.get(addr)
                if sid is not None and self._shards[sid].uid == info["uid"]:
                    self._shards[sid].update(info)
                    live.add(sid)
                    if self._shards[sid].stalled:
                        self._shards[sid].stalled = False
                        resumed.append(self._shards[sid])
                    continue
                if sid is not None:                     # same address, a new shard
                    self.lose(sid, "replaced")
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
                    self.lose(sid, "worker left")
        for ref in stalled:
            logger.warning("replay plane %r: shard %d on %s is stalled (its worker did not answer "
                           "within %g s): not sampled until it answers", self.name, ref.id,
                           ref.address, self.answer_within)
        for ref in resumed:
            logger.warning("replay plane %r: shard %d on %s answers again", self.name, ref.id, ref.address)
        for ref in new:
            self.events.emit("shard-new", shard=ref.id, worker=ref.address,
                             capacity=ref.capacity, restored=ref.size > 0)
        if self.on_refresh is not None:
            self.on_refresh()

    def maybe_refresh(self) -> bool:
        """:meth:`refresh` if the last one is ``refresh_interval`` old; whether it did."""
        last = self._last_refresh
        if last is not None and time.monotonic() - last < self.refresh_interval:
            return False
        self.refresh()
        return True

    def lose(self, sid: int, reason: str) -> None:
        """Mark shard ``sid`` lost (once), note its last checkpoint, log ``shard-lost``."""
        with self.lock:
            ref = self._shards[sid]
            if ref.lost:
                return
            ref.lost, ref.lost_size = True, ref.size
            ref.lost_reason = reason
            ref.mass, ref.size = 0.0, 0
            if self._by_addr.get(ref.address) == sid:
                del self._by_addr[ref.address]
            ref.checkpoint = self.find_checkpoint(ref.uid)
        kept = ref.checkpoint["size"] if ref.checkpoint else 0
        logger.warning("replay plane %r: shard %d on %s lost (%s): %d transitions, %d in its "
                       "last checkpoint", self.name, sid, ref.address, reason, ref.lost_size, kept)
        self.events.emit("shard-lost", shard=sid, worker=ref.address, reason=reason,
                         size=ref.lost_size, checkpointed=kept)

    def check_failure(self, sid: int, fut: Any) -> None:
        """A sample task of shard ``sid`` failed: refresh to find out whether its worker is
        gone; an empty shard is noted as empty, any other error is raised."""
        self.refresh()
        ref = self._shards[sid]
        if not ref.lost and fut.status == "error":
            exc = fut.exception(timeout=5)
            if isinstance(exc, EmptyPlaneError):
                ref.size, ref.mass = 0, 0.0
                return
            raise exc

    def find_checkpoint(self, uid: str) -> dict | None:
        """What the committed checkpoint of shard ``uid`` holds (None without one)."""
        if not self.checkpoint_dir:
            return None
        from ...exceptions import CheckpointError
        from ..checkpoints import read_meta
        from .worker_shard import checkpoint_info

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

    def nothing_to_sample(self) -> Exception:
        """:class:`ShardsLostError` when every known shard is lost (raised at once: no
        worker is left to ingest into), else :class:`EmptyPlaneError` (actors may still come)."""
        with self.lock:
            refs = list(self._shards.values())
            if not refs or not all(r.lost for r in refs):
                return EmptyPlaneError()
            lost = [{"id": r.id, "worker": r.address, "reason": r.lost_reason or "lost",
                     "size": int(r.lost_size),
                     "checkpointed": int(r.checkpoint["size"]) if r.checkpoint else 0}
                    for r in refs if r.restored_to is None]    # restored: counted where it went
        return ShardsLostError(self.name, lost)

    # --- drawing a batch -----------------------------------------------------------------
    def allocate(self, n: int) -> dict[int, int]:
        """Split a batch of ``n`` over the live shards by their sampling mass (multinomial)."""
        with self.lock:
            live = self.live()
            if not live:
                raise self.nothing_to_sample()
            mass = np.array([r.mass for r in live], dtype=np.float64)
            counts = self.rng.multinomial(n, mass / mass.sum())
        return {r.id: int(c) for r, c in zip(live, counts) if c}

    def remote_share(self) -> float:
        """The share of the sampling mass that lives on other workers than the learner's."""
        with self.lock:
            live = self.live()
            tot = sum(r.mass for r in live)
            if not tot:
                return 1.0
            return sum(r.mass for r in live if not self.is_local(r)) / tot

    def bandwidth(self) -> float:
        """Dask's measured bandwidth to the shards' workers (bytes/s; their mean)."""
        with self.lock:
            per = self._bw.get("workers", {})
            vals = [per[r.address] for r in self.live() if r.address in per]
        if vals:
            return float(np.mean(vals))
        tot = self._bw.get("total", float("nan"))
        return float(tot) if tot == tot else 100e6

    def sample_future(self, ref: ShardRef, n: int) -> Any:
        """A task drawing ``n`` transitions from shard ``ref``, pinned to its worker."""
        return self.client.submit(shard_ops.sample, self.name, n, ref.uid, pure=False,
                                  workers=[ref.address], allow_other_workers=False,
                                  key=f"replay-sample-{self.name}-{uuid.uuid4().hex}")

    def assemble(self, replies: list[tuple[int, dict]], batch_size: int) -> Batch | None:
        """The batch of shard ``replies``; None (and the shard lost) when one came from a
        new shard on the address (the worker was replaced)."""
        ok = []
        with self.lock:
            for sid, r in replies:
                ref = self._shards[sid]
                if r["records"] is None:            # the shard there was replaced
                    self.lose(sid, "replaced")
                    return None
                ref.update(r["info"])
                ref.sampled += len(r["keys"])
                ok.append((sid, r))
            self.counters["sampled"] += batch_size
            beta = getattr(self.sampler, "beta", None) if self.sampler.prioritized else None
            leaves = [r.min_leaf for r in self._shards.values()
                      if beta is not None and not r.lost and r.size and r.min_leaf == r.min_leaf]
            min_leaf = float(min(leaves)) if leaves else 1.0
        return assemble(self.spec, ok, beta, min_leaf)
