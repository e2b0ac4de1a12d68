"""The experience plane: ingest, placement, sampling, priorities, delivery, checkpoints.

:class:`ExperiencePlane` composes the roles: an :class:`~dask_research.replay.ExperienceSpec`,
a storage (one :class:`HostStorage`, or a :class:`TieredStorage` with a placement policy), a
sampler, an optional rate limiter, and a :class:`~dask_research.replay.ring.Ring` (keys, cursor,
validity: transition *key* ``k``, its insertion number, lives in slot ``k % capacity`` while it
is among the newest ``size``). Batches carry keys, so a priority update for a transition that
was overwritten in the meantime is dropped instead of landing on its successor. Snapshots are
:mod:`~dask_research.replay.snapshot`'s format, written by
:mod:`~dask_research.replay.checkpoints`; every sampling path goes through the public
:meth:`ExperiencePlane.draw`.

Thread safety: ingest, sampling, priority updates, migration and checkpoints may run in
different threads; each holds the plane's lock only for its own copy.

Checkpoints: the first :meth:`ExperiencePlane.checkpoint` into a directory makes the plane that
directory's one writer (it takes the directory's lease, :mod:`~dask_research.replay.checkpoints`)
until :meth:`ExperiencePlane.close`; another live plane, in this process or another, is refused.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane({"obs": ((4,), "float32"), "reward": ((), "float32")},
...                                capacity=1000, seed=0)
>>> plane.ingest({"obs": np.ones((64, 4)), "reward": np.arange(64)})
64
>>> len(plane), plane.capacity
(64, 1000)
>>> b = plane.sample(8)
>>> b.obs.shape, b.indices.dtype
((8, 4), dtype('int64'))
>>> plane.close()
"""
from __future__ import annotations

import math
import os
import pathlib
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import config
from ..exceptions import InputError
from ..seeds import seed_sequence
from . import checkpoints, snapshot
from .batch import Batch
from .local_delivery import BatchIterator, tensordict_output
from .migrator import Migrator
from .rate_limiter import RateLimiter
from .ring import Ring, fit_batch
from .samplers import Sampler, UniformSampler
from .snapshot import FORMAT, FORMAT_VERSION
from .source import Draw, EmptyPlaneError, PlaneClosedError
from .spec import ExperienceSpec, add_checks, priority_arrays
from .stats import PlaneCounters, PlaneStats
from .storages import HostStorage, Tier, TieredStorage
from .storages.host import _check_host_memory
from .tier_placement import Placement, PlacementReport, single_tier_report

__all__ = ["ExperiencePlane", "EmptyPlaneError", "PlaneClosedError", "FORMAT", "FORMAT_VERSION", "DRAW_BYTES"]

#: Bytes a drawn transition costs beyond its record while a batch is drawn (the random numbers,
#: slots, keys and weights); a batch whose records and these exceed the memory available is
#: refused up front (asked of the OS only for batches above 64 MiB).
DRAW_BYTES = 64
_ASK_ABOVE = 64 * 2**20


def _close_writers(writers: dict[str, checkpoints.Writer]) -> None:
    """Release the checkpoint leases of a plane (at close, or when it is collected unclosed)."""
    for w in list(writers.values()):
        w.close()


def _positive(name: str, value: Any, expected: str, whole: bool = False) -> float:
    """``value`` if it is a finite number > 0 (a whole one with ``whole``); else :class:`InputError`."""
    ok = (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
          and math.isfinite(value) and value > 0 and (not whole or value == int(value)))
    if not ok:
        raise InputError(name, value, expected, where="ExperiencePlane")
    return float(value)


class ExperiencePlane:
    """Tiered, sampled, prefetched experience replay on one process.

    Parameters
    ----------
    spec : ExperienceSpec or mapping of name -> (shape, dtype)
    capacity : int, optional
        Transitions kept (FIFO). Required without ``tiers``; with tiers it defaults to the sum
        of their capacities.
    tiers : list of Tier, optional
        E.g. ``[DeviceTier("2GiB"), HostTier("16GiB"), DiskTier("runs/replay")]``. Default:
        one host tier holding ``capacity`` transitions.
    sampler : Sampler, optional
        Default :class:`UniformSampler`.
    rate_limiter : RateLimiter, optional
        Applied to ``ingest`` and to the delivery pipeline (not to :meth:`sample`).
    seed : int, SeedSequence or Generator, optional
        Seed of the sampling generator, as ``numpy.random.default_rng`` takes it (:mod:`dask_research.seeds`).
    migrate : {"background", "manual"}, optional
        With several tiers: rebalance in a background thread (default), or only when
        :meth:`rebalance` is called (``research.replay.migrate``).
    migrate_interval : float, optional
        Seconds between background rebalances while placement is stale
        (``research.replay.migrate-interval``, 0.1).
    migrate_batch : int, optional
        Most transitions one background round moves; the lock is held for their copy only
        (``research.replay.migrate-batch``, 65,536).
    client : distributed.Client, optional
        With a client, the plane publishes its statistics (numbers only) to the scheduler's
        event log every ``publish_interval`` seconds, for the dashboard's Experience page.
    name : str, optional
        The plane's name on the Experience page (default: ``plane-<8 hex digits>``).
    publish_interval : float, optional
        Default ``research.replay.publish-interval`` (1 s; ``null`` there, or 0 here: never).
    """

    def __init__(self, spec: ExperienceSpec | Mapping[str, Any], capacity: int | None = None,
                 tiers: Sequence[Tier] | None = None, sampler: Sampler | None = None,
                 rate_limiter: RateLimiter | None = None, seed: int | None = None,
                 migrate: str | None = None, migrate_interval: float | None = None,
                 migrate_batch: int | None = None, client: Any = None, name: str | None = None,
                 publish_interval: float | None = None):
        self.spec = spec if isinstance(spec, ExperienceSpec) else ExperienceSpec(spec)
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer))
                                     or capacity < 1):
            raise InputError("capacity", capacity, "a positive number of transitions",
                             where="ExperiencePlane")
        migrate = config.resolve("replay.migrate", migrate)
        migrate_interval = _positive("migrate_interval", config.resolve("replay.migrate-interval", migrate_interval),
                                     "a number of seconds > 0")
        migrate_batch = int(_positive("migrate_batch", config.resolve("replay.migrate-batch", migrate_batch),
                                      "a whole number of transitions > 0", whole=True))
        if migrate not in ("background", "manual"):
            raise InputError("migrate", migrate, "'background' or 'manual'", where="ExperiencePlane")
        self.sampler = sampler if sampler is not None else UniformSampler()
        if not isinstance(self.sampler, Sampler):
            raise InputError("sampler", sampler, "a Sampler (UniformSampler(), "
                             "PrioritizedSampler(alpha, beta), RecentSampler(window))")
        # the seed is checked before tiers are built: bad input leaves no disk file behind
        self.rng = np.random.default_rng(seed_sequence(seed, where="ExperiencePlane"))
        if tiers is None:
            if capacity is None:
                raise InputError("capacity", None, "a number of transitions, e.g. "
                                 "ExperiencePlane(spec, capacity=1_000_000)", where="ExperiencePlane")
            self.storage: HostStorage | TieredStorage = HostStorage(self.spec, int(capacity))
            self._placement: Placement | None = None
        else:
            self.storage = TieredStorage(self.spec, tiers, capacity)
            self._placement = Placement(self.storage, self.sampler)
        self.capacity = int(self.storage.rows)
        self.ring = Ring(self.capacity)
        try:
            self._setup(rate_limiter, migrate, migrate_interval, migrate_batch, client,
                        name, publish_interval)
        except BaseException:            # bad input found late leaves no disk file behind
            self.storage.close()
            raise

    def _setup(self, rate_limiter: RateLimiter | None, migrate: str, migrate_interval: float,
               migrate_batch: int, client: Any, name: str | None,
               publish_interval: float | None) -> None:
        """The rest of ``__init__``, once the storage exists (which an error here closes)."""
        self.sampler.attach(self.capacity)
        # add(): per-field checks for the one-transition fast path (host storage only)
        self._add_plan = add_checks(self.spec) if type(self.storage) is HostStorage else None
        self.rate_limiter = rate_limiter
        self._lock = threading.RLock()
        self.migrate = migrate
        self._migrator = (Migrator(self.rebalance, self.rebalance_pending, migrate_interval,
                                   migrate_batch) if self._placement is not None else None)
        self._counters = PlaneCounters()
        self._deliveries: list[Any] = []
        self._closed = False              # set by close(), under the lock
        if name is None:
            import uuid

            name = f"plane-{uuid.uuid4().hex[:8]}"
        self.name = str(name)
        self._publisher = None
        self._writers: dict[str, checkpoints.Writer] = {}      # checkpoint directory -> its writer
        self._writers_guard = threading.Lock()
        weakref.finalize(self, _close_writers, self._writers)      # a plane collected unclosed
        if client is not None:
            from .stats_publisher import auto_publisher

            self._publisher = auto_publisher(self, client, self.name, publish_interval)

    # --- ring ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.ring.size

    @property
    def total(self) -> int:
        """Transitions ever inserted (the next key)."""
        return self.ring.total

    @property
    def size(self) -> int:
        """Transitions stored."""
        return self.ring.size

    @property
    def cursor(self) -> int:
        """Slot the next transition goes to."""
        return self.ring.cursor

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the plane then refuses ingest and sampling)."""
        return self._closed

    @property
    def lock(self) -> threading.RLock:
        """The plane's (re-entrant) lock: held for each copy in or out of the ring."""
        return self._lock

    # --- ingest --------------------------------------------------------------------------
    def ingest(self, batch: Mapping[str, Any], timeout: float | None = None,
               overflow: str | None = None) -> int:
        """Add one transition or a batch (dict of arrays: numpy, torch or CuPy).

        Everything is validated before anything is written: a bad batch raises
        :class:`~dask_research.exceptions.SpecError` naming the field and changes nothing.
        With a rate limiter, waits (up to ``timeout``) until inserting is allowed. Returns the
        number of transitions ingested.

        A batch larger than the capacity raises :class:`~dask_research.exceptions.CapacityError`
        with ``overflow="raise"``; with ``overflow="keep-newest"`` it is ingested as if its
        transitions came one by one: the newest ``capacity`` are kept, the older ones count as
        inserted and overwritten (their keys are skipped, ``stats()["inserted"]`` counts them),
        as SB3's and TorchRL's rings do. Default ``research.replay.overflow``.
        """
        t0 = time.perf_counter()
        fields, n = self.spec.validate(batch)
        skip = 0
        if n > self.capacity:
            fields, skip = fit_batch(fields, n, self.capacity, self.spec.itemsize, overflow)
        if self.rate_limiter is not None:
            self.rate_limiter.await_insert(n, timeout)
        with self._lock:
            if self._closed:
                raise PlaneClosedError(self.name, "ingest")
            ring = self.ring
            ring.skip(skip)               # keys of the dropped oldest: inserted and overwritten
            m = n - skip
            segments = ring.segments(m)
            if len(segments) == 1:
                c = segments[0][0]
                self.storage.write_fields(c, fields)
                self.sampler.on_insert(c, m)
            else:
                for c, off, k in segments:
                    self.storage.write_fields(c, {f: v[off:off + k] for f, v in fields.items()})
                    self.sampler.on_insert(c, k)
            ring.advance(m)
            self._counters.ingested(t0)
        if self.rate_limiter is not None:
            self.rate_limiter.inserted(n)
        if self._migrator is not None:
            self._migrator.poke(start=self.migrate == "background")
        return n

    def add(self, **fields: Any) -> int:
        """Add one transition given as keyword arguments, e.g. ``plane.add(obs=o, action=1,
        reward=0.5, next_obs=o2, done=False)``; returns 1.

        The same validation as :meth:`ingest` (every field present, the spec's shape, a value
        that fits the dtype); the fast path takes numpy arrays of exactly the field's shape and
        dtype and Python or numpy scalars that fit, and writes them straight into the ring.
        Anything else (torch tensors, other dtypes, a leading batch axis of 1) goes through
        :meth:`ingest`, so the result is the same; so does every call on a plane with tiers
        (the fast path writes into the one host tier).
        """
        plan = self._add_plan
        if plan is None or len(fields) != len(plan):
            return self._add_slow(fields)
        for name, v in fields.items():
            chk = plan.get(name)
            if chk is None or not chk(v):
                return self._add_slow(fields)
        rl = self.rate_limiter
        if rl is not None:
            rl.await_insert(1, None)
        t0 = time.perf_counter()
        with self._lock:
            if self._closed:
                raise PlaneClosedError(self.name, "add")
            ring = self.ring
            c = ring.total % ring.capacity
            views = self.storage._views      # type: ignore[union-attr]  # _add_plan: host only
            for name, v in fields.items():
                views[name][c] = v
            self.sampler.on_insert(c, 1)
            ring.advance(1)
            self._counters.ingested(t0)
        if rl is not None:
            rl.inserted(1)
        if self._migrator is not None:
            self._migrator.poke()
        return 1

    def _add_slow(self, fields: Mapping[str, Any]) -> int:
        batch = dict(fields)
        _, n = self.spec.validate(batch)           # raises SpecError naming the field
        if n != 1:
            from ..exceptions import SpecError

            raise SpecError(None, f"add() takes one transition; got a batch of {n} (use ingest)")
        return self.ingest(batch)

    # --- sampling ------------------------------------------------------------------------
    def draw(self, batch_size: int, out: np.ndarray | None = None,
             times: dict[str, float] | None = None, device_ok: bool = False,
             leaves: bool = False) -> Draw:
        """Sample and gather one batch under the lock: a :class:`~.source.Draw` of
        ``(records, keys, weights, leaves)``; every sampling path (:meth:`sample`,
        :meth:`batches`, a cluster shard) goes through here.

        ``out`` is a record buffer to gather into (else a fresh one); ``times`` receives the
        ``sample`` and ``gather`` seconds. With ``device_ok``, a batch whose rows all live in
        one GPU tier is gathered on the device and returned as a ``(n, itemsize)`` uint8 CuPy
        array instead of host records. With ``leaves``, the sampler's priority leaves of the
        drawn slots come along (None without priorities). Raises :class:`EmptyPlaneError` on
        an empty plane. A ``batch_size`` that is not a positive whole number, or a batch that
        would not fit in the memory available (its records plus :data:`DRAW_BYTES` per
        transition), is refused up front (:class:`~dask_research.exceptions.InputError`,
        :class:`~dask_research.exceptions.CapacityError`).

        >>> import numpy as np
        >>> from dask_research import replay
        >>> p = replay.ExperiencePlane({"x": ((), "int64")}, capacity=8, seed=0,
        ...                            sampler=replay.PrioritizedSampler(1.0, 1.0, eps=0.0))
        >>> _ = p.ingest({"x": np.arange(3)})
        >>> d = p.draw(4, leaves=True)
        >>> bool((d.records["x"] == d.keys).all()), d.leaves.tolist(), d.weights.tolist()
        (True, [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
        >>> p.close()
        """
        batch_size = self._batch_size(batch_size)
        with self._lock:
            if self._closed:
                raise PlaneClosedError(self.name, "sample")
            t0 = time.perf_counter()
            size = self.ring.size
            if size == 0:
                raise EmptyPlaneError()
            slots, keys, weights = self.sampler.draw(self.ring.total, size, batch_size, self.rng)
            leaf = self.sampler.leaves(slots) if leaves else None
            t1 = time.perf_counter()
            st = self.storage
            dev = st.device_rows(slots) if device_ok and isinstance(st, TieredStorage) else None
            if dev is not None:               # all rows in one GPU tier: gather there
                storage, rows = dev
                rec = storage.gather(rows)
            elif out is None and type(self.storage) is HostStorage:
                rec = self.storage.take(slots)
            else:
                rec = self.spec.empty(batch_size) if out is None else out
                self.storage.read_records(slots, rec)
            t2 = time.perf_counter()
            self._counters.sampled(batch_size, t2 - t0)
        if times is not None:
            times["sample"] = t1 - t0
            times["gather"] = t2 - t1
        return Draw(rec, keys, weights, leaf)

    def sample(self, batch_size: int | None = None) -> Batch:
        """Sample one batch now, in this thread, as numpy arrays (no rate limiting).

        Field arrays are views of one fresh record buffer (no copies); ``indices`` are keys.
        A batch size that is not a positive whole number, or a batch larger than the memory
        available, is refused up front (see :meth:`draw`).

        >>> from dask_research import replay
        >>> p = replay.ExperiencePlane({"x": ((), "int64")}, capacity=8)
        >>> _ = p.ingest({"x": [1, 2, 3]})
        >>> p.sample(10**15)                                 # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dask_research.exceptions.CapacityError: sample(1,000,000,000,000,000): a batch of that many transitions (72 bytes each while it is drawn; sample smaller batches) needs 72,000,000,000,000,000 bytes but only ... are available
        >>> p.sample(2.5)
        Traceback (most recent call last):
        ...
        dask_research.exceptions.InputError: sample: batch_size=2.5 is invalid; expected a positive whole number of transitions
        >>> p.close()
        """
        rec, keys, weights, _ = self.draw(self._batch_size(config.resolve("replay.batch-size", batch_size)))
        return Batch({n: rec[n] for n in self.spec.names}, keys, weights)

    def _batch_size(self, batch_size: Any) -> int:
        """``batch_size`` as an int, or the refusal: not a positive whole number, or more than fits."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise InputError("batch_size", batch_size, "a positive whole number of transitions", where="sample")
        n = int(batch_size)
        per = self.spec.itemsize + DRAW_BYTES
        if n * per > _ASK_ABOVE:
            _check_host_memory(n * per, f"sample({n:,}): a batch of that many transitions ({per} bytes each "
                               "while it is drawn; sample smaller batches)")
        return n

    def gather_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records of ``keys`` (any shape, flattened) and a mask of which keys were valid.

        Invalid keys (overwritten or not yet inserted) read an arbitrary valid record; use the
        mask. Used by transforms that look at neighbouring transitions (n-step returns).
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        with self._lock:
            if self._closed:
                raise PlaneClosedError(self.name, "gather_keys")
            ring = self.ring
            if ring.size == 0:
                raise EmptyPlaneError()
            valid = ring.valid(keys)
            safe = ring.slots(np.where(valid, keys, ring.total - 1))
            rec = self.spec.empty(len(keys))
            self.storage.read_records(safe, rec)
        return rec, valid

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set new priorities for the transitions with keys ``indices`` (from ``batch.indices``).

        Accepts numpy, torch or CuPy arrays. Keys of transitions that were overwritten since
        they were sampled are skipped. Returns how many priorities were applied. A no-op for
        samplers without priorities. Keys that are not integers and priorities that are not
        real numbers (objects, strings, complex), negative, not finite, or whose leaf would
        exceed the sampler's bound are refused with an
        :class:`~dask_research.exceptions.InputError` naming the value, and nothing is applied
        (see :class:`~dask_research.replay.PrioritizedSampler`).
        """
        keys, pr = priority_arrays(indices, priorities, where="update_priorities")
        if not self.sampler.prioritized:
            return 0
        with self._lock:
            valid = self.ring.valid(keys)
            stale = 0
            if not valid.all():
                stale = int((~valid).sum())
                keys, pr = keys[valid], pr[valid]
            self.sampler.update(self.ring.slots(keys), pr)
            self._counters.updated(len(keys), stale)
        if self._migrator is not None:
            self._migrator.poke()
        return len(keys)

    # --- delivery ------------------------------------------------------------------------
    def batches(self, batch_size: int | None = None, prefetch: int | None = None,
                to: str = "numpy", device: Any = None, transforms: Sequence[Callable] = (),
                max_batches: int | None = None, timeout: float | None = None,
                switch_interval: float | None = None, bool_as: Any = None):
        """Iterate over batches prepared ahead by a background pipeline.

        sample -> gather per tier -> ``transforms`` (callables on numpy batches) -> copy to
        ``to`` (``"numpy"``, ``"torch"``, ``"cupy"``, or ``"tensordict"``: torch tensors in a
        ``TensorDict`` with ``"index"``, which needs the ``tensordict`` package) on ``device``
        (e.g. ``"cuda:0"``). With
        ``prefetch=k > 0`` up to ``k`` batches wait in a bounded queue; ``prefetch=0`` samples
        in ``next()``. The time ``next()`` blocks is the exposed latency (``plane.stats()``).
        Use as a context manager or call ``close()`` to stop the pipeline early.

        With a rate limiter, a batch waits at most ``timeout`` seconds for the actors (default:
        the limiter's own ``timeout``, which defaults to ``research.replay.rate-timeout``) and
        then raises :class:`~dask_research.exceptions.RateLimitTimeout`.

        ``bool_as`` (e.g. ``"float32"``) delivers every bool field (stored ones and those
        transforms add) as 0/1 numbers of that dtype, so that a torch learner can write
        ``1 - done`` (``torch.bool`` refuses subtraction). Default ``None``: fields come out in
        their stored dtype; a field stored as float stays float.

        The pipeline and its figures: :class:`~dask_research.replay.BatchIterator`.
        """
        wrap, to = tensordict_output(to)
        it = BatchIterator(self, batch_size=batch_size, prefetch=prefetch, to=to, device=device,
                           transforms=transforms, max_batches=max_batches, timeout=timeout,
                           switch_interval=switch_interval, bool_as=bool_as)
        self._deliveries = [d for d in self._deliveries if not d.closed][-7:] + [it]
        return wrap(it)

    # --- placement -----------------------------------------------------------------------
    def rebalance(self, max_moves: int | None = None) -> int:
        """Move misplaced transitions to their target tiers now; returns how many moved.

        The plan is computed from a snapshot without blocking ingest or sampling; the lock is
        held only while the moves (at most ``max_moves``, hottest first) are copied.
        """
        if self._placement is None or self._migrator is None:
            return 0
        self._migrator.clear()
        storage = self.storage
        assert isinstance(storage, TieredStorage)           # placement: tiers
        with self._lock:
            slots, keys = self.ring.stored()
            heat = np.array(self.sampler.heat(slots, keys), dtype=np.float64, copy=True)
            current = storage.tier_of[slots]
        return self._placement.rebalance(slots, keys, heat, current, self._lock,
                                         self.ring.valid, max_moves)

    def rebalance_pending(self) -> bool:
        """Whether the last background round left misplaced transitions (cheap estimate)."""
        return self._placement is not None and self._placement.last_left > 0

    def placement(self) -> PlacementReport:
        """What lives in which tier and why (print it)."""
        with self._lock:
            slots, keys = self.ring.stored()
            if self._placement is not None:
                return self._placement.report(slots, keys)
            assert isinstance(self.storage, HostStorage)    # no placement: one host storage
            return single_tier_report(self.storage, keys, self.sampler.policy)

    # --- statistics ----------------------------------------------------------------------
    def stats(self) -> PlaneStats:
        """Counters, rates, tier occupancy and delivery figures (exposed latency, stages)."""
        with self._lock:
            size, total = self.ring.size, self.ring.total
            figures = self._counters.figures(total)
            tiers = self.storage.tier_stats(size)
            moved = self.storage.moves
        out: dict[str, Any] = {"size": size, "capacity": self.capacity, "inserted": total,
                               **figures, "tiers": tiers, "migrated": moved}
        if self.rate_limiter is not None:
            out["rate_limiter"] = self.rate_limiter.stats()
        if self._deliveries:
            out["delivery"] = self._deliveries[-1].stats.summary()
        return PlaneStats(out)

    # --- snapshots and checkpoints -------------------------------------------------------
    def snapshot(self, chunk: int = 16_384) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A consistent copy of the plane: ``(meta, arrays)``, JSON-able meta and numpy arrays
        (the format: :mod:`~dask_research.replay.snapshot`).

        The plane's lock is held only to read the counters and then for each chunk of
        ``chunk`` records, so ingest waits at most one chunk copy. Records are copied newest
        first; transitions that ingest overwrites meanwhile (the oldest) are left out, so the
        snapshot holds the newest transitions as of its start, minus those.
        """
        return snapshot.take(self, chunk)

    def load_snapshot(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                      where: str = "snapshot") -> None:
        """Replace the contents with a :meth:`snapshot` (same spec; capacity may differ)."""
        snapshot.apply(self, meta, arrays, where)
        if self._migrator is not None:
            self._migrator.poke()

    def checkpoint(self, path: str | os.PathLike[str], chunk: int = 16_384,
                   extra: Mapping[str, Any] | None = None) -> pathlib.Path:
        """Commit the plane to checkpoint directory ``path`` in one atomic step.

        The snapshot (see :meth:`snapshot`; ingest waits at most one chunk copy at a time) is
        written as a new version directory, ``data.npz`` (no pickle) and ``meta.json``, and
        committed by replacing the ``CURRENT`` pointer; older versions are removed after the
        commit (see :mod:`~dask_research.replay.checkpoints`). A crash at any point leaves the
        previous checkpoint restorable, or the new one complete. ``extra`` (JSON-able) is stored
        in the metadata as ``meta["extra"]``. Returns ``path``.

        The first checkpoint into ``path`` makes this plane its one writer until :meth:`close`
        (it holds the directory's lease): while it lives, another plane checkpointing into
        ``path`` (in this process or another) is refused with a
        :class:`~dask_research.exceptions.CheckpointError` naming this one.
        """
        snapshot.commit(self, path, chunk, extra)
        return pathlib.Path(path)

    def checkpoint_writer(self, path: str | os.PathLike[str]) -> checkpoints.Writer:
        """This plane's writer of checkpoint directory ``path`` (made on first use; closed by :meth:`close`)."""
        key = os.path.realpath(os.fspath(path))
        with self._writers_guard:
            w = self._writers.get(key)
            if w is None or w.closed:
                w = self._writers[key] = checkpoints.Writer(path)
            return w

    @classmethod
    def restore(cls, path: str | os.PathLike, tiers: Sequence[Tier] | None = None,
                sampler: Sampler | None = None, rate_limiter: RateLimiter | None = None,
                **kwargs: Any) -> ExperiencePlane:
        """Rebuild a plane from :meth:`checkpoint`. Tiers are chosen anew (default: one host
        tier); the sampler is rebuilt from the checkpoint unless given.

        Reads the committed version (a write interrupted at any step is not seen). Any
        malformed checkpoint (truncated, bit-flipped, re-typed, a pickled array, data that does
        not match its metadata) is refused with a
        :class:`~dask_research.exceptions.CheckpointError` naming it; nothing is unpickled.
        """
        plane: ExperiencePlane = snapshot.restore(cls, path, tiers, sampler, rate_limiter, **kwargs)
        return plane

    def contents(self) -> dict[str, np.ndarray]:
        """All stored transitions, oldest first, as numpy arrays (a copy; for tests and export)."""
        _, arrays = self.snapshot()
        return {name: arrays[f"field.{name}"] for name in self.spec.names}

    # --- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop background threads and delivery pipelines; release tiers (disk files) and the
        checkpoint directories this plane writes (their leases)."""
        for d in self._deliveries:
            d.close()
        if self._publisher is not None:
            self._publisher.stop()
        if self._migrator is not None:
            self._migrator.close()
        with self._lock:                  # an ingest or draw in flight finishes first
            self._closed = True
            self.storage.close()
        with self._writers_guard:
            _close_writers(self._writers)

    def __enter__(self) -> ExperiencePlane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ExperiencePlane(size={self.size:,}/{self.capacity:,}, storage={self.storage!r}, "
                f"sampler={self.sampler!r})")
