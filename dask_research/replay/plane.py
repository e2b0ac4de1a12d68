"""The experience plane: ingest, placement, sampling, priorities, delivery, checkpoints.

:class:`ExperiencePlane` composes the roles: an :class:`~dask_research.replay.ExperienceSpec`,
a storage (one :class:`HostStorage`, or a :class:`TieredStorage` with a placement policy), a
sampler, an optional rate limiter. It owns the ring: ``total`` transitions were ever inserted,
the newest ``size`` are stored, transition *key* ``k`` (its insertion number) lives in slot
``k % capacity`` and is valid while ``total - size <= k < total``. Batches carry keys, so a
priority update for a transition that was overwritten in the meantime is dropped instead of
landing on its successor.

Thread safety: ingest, sampling, priority updates, migration and checkpoints may run in
different threads; each holds the plane's lock only for its own copy.

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

import json
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import config
from ..exceptions import CheckpointError, InputError, ResearchError
from .batch import Batch
from .placement import Placement, PlacementReport, TierPlacement
from .rate_limiter import RateLimiter
from .samplers import PrioritizedSampler, RecentSampler, Sampler, UniformSampler
from .spec import ExperienceSpec
from .stats import PlaneStats
from .storages import HostStorage, Tier, TieredStorage

FORMAT = "dask-research-replay"
FORMAT_VERSION = 1
_SAMPLERS = {c.__name__: c for c in (UniformSampler, PrioritizedSampler, RecentSampler)}


class EmptyPlaneError(ResearchError, LookupError):
    """Sampling from a plane that holds no transitions."""

    def __str__(self) -> str:
        return "cannot sample from an empty experience plane; ingest transitions first"


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
    seed : int, optional
        Seed of the sampling generator (``numpy.random.default_rng``).
    migrate : {"background", "manual"}
        With several tiers: rebalance in a background thread (default), or only when
        :meth:`rebalance` is called.
    migrate_interval : float
        Seconds between background rebalances while placement is stale.
    migrate_batch : int
        Most transitions one background round moves (the lock is held for their copy only).
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
                 migrate: str = "background", migrate_interval: float = 0.1,
                 migrate_batch: int = 65_536, client: Any = None, name: str | None = None,
                 publish_interval: float | None = None):
        self.spec = spec if isinstance(spec, ExperienceSpec) else ExperienceSpec(spec)
        if capacity is not None and (not isinstance(capacity, (int, np.integer)) or capacity < 1):
            raise InputError("capacity", capacity, "a positive number of transitions",
                             where="ExperiencePlane")
        if migrate not in ("background", "manual"):
            raise InputError("migrate", migrate, "'background' or 'manual'", where="ExperiencePlane")
        self.sampler = sampler if sampler is not None else UniformSampler()
        if not isinstance(self.sampler, Sampler):
            raise InputError("sampler", sampler, "a Sampler (UniformSampler(), "
                             "PrioritizedSampler(alpha, beta), RecentSampler(window))")
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
        self.sampler.attach(self.capacity)
        from .spec import add_checks

        # add(): per-field checks for the one-transition fast path (host storage only)
        self._add_plan = add_checks(self.spec) if type(self.storage) is HostStorage else None
        self.rate_limiter = rate_limiter
        self.rng = np.random.default_rng(seed)
        self.total = 0
        self.size = 0
        self._lock = threading.RLock()
        self.migrate = migrate
        self.migrate_interval = float(migrate_interval)
        self.migrate_batch = int(migrate_batch)
        self._dirty = threading.Event()
        self._closed = threading.Event()
        self._migrator: threading.Thread | None = None
        self._counters = {"ingest_calls": 0, "sample_calls": 0, "sampled": 0, "ingest_s": 0.0,
                          "sample_s": 0.0, "priority_updates": 0, "stale_updates": 0}
        self._t_first: float | None = None
        self._t_last = 0.0
        self._deliveries: list[Any] = []
        if name is None:
            import uuid

            name = f"plane-{uuid.uuid4().hex[:8]}"
        self.name = str(name)
        self._publisher = None
        if client is not None:
            from .publish import auto_publisher

            self._publisher = auto_publisher(self, client, self.name, publish_interval)

    # --- ring ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    @property
    def cursor(self) -> int:
        """Slot the next transition goes to."""
        return self.total % self.capacity

    def _keys(self, slots: np.ndarray) -> np.ndarray:
        """Keys (insertion numbers) of valid ``slots``."""
        d = self.cursor - 1 - slots
        d %= self.capacity
        return (self.total - 1) - d

    def _valid(self) -> tuple[np.ndarray, np.ndarray]:
        """All valid ``(slots, keys)``, oldest first."""
        keys = np.arange(self.total - self.size, self.total, dtype=np.int64)
        return keys % self.capacity, keys

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
        cap = self.capacity
        skip = 0
        if n > cap:
            overflow = config.get("replay.overflow", overflow)
            if overflow == "keep-newest":
                skip = n - cap
                fields = {k: v[skip:] for k, v in fields.items()}
            elif overflow == "raise":
                from ..exceptions import CapacityError

                raise CapacityError(f"a batch of {n:,} transitions (the plane holds {cap:,}; ingest in "
                                    "smaller batches, give the plane more capacity, or pass "
                                    "overflow='keep-newest')", n * self.spec.itemsize,
                                    cap * self.spec.itemsize)
            else:
                raise InputError("overflow", overflow, "'raise' or 'keep-newest'", where="ingest")
        if self.rate_limiter is not None:
            self.rate_limiter.await_insert(n, timeout)
        with self._lock:
            total = self.total + n
            self.total += skip            # keys of the dropped oldest: inserted and overwritten
            m = n - skip
            c = self.total % cap
            first = min(m, cap - c)
            if first == m:
                self.storage.write_fields(c, fields)
                self.sampler.on_insert(c, m)
            else:
                self.storage.write_fields(c, {k: v[:first] for k, v in fields.items()})
                self.sampler.on_insert(c, first)
                self.storage.write_fields(0, {k: v[first:] for k, v in fields.items()})
                self.sampler.on_insert(0, m - first)
            self.total = total
            self.size = min(self.size + m, cap)
            self._count_ingest(t0)
        if self.rate_limiter is not None:
            self.rate_limiter.inserted(n)
        if self._placement is not None:
            self._dirty.set()
            if self.migrate == "background" and self._migrator is None:
                self._start_migrator()
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
            c = self.total % self.capacity
            views = self.storage._views
            for name, v in fields.items():
                views[name][c] = v
            self.sampler.on_insert(c, 1)
            self.total += 1
            if self.size < self.capacity:
                self.size += 1
            self._count_ingest(t0)
        if rl is not None:
            rl.inserted(1)
        if self._placement is not None:
            self._dirty.set()
        return 1

    def _add_slow(self, fields: Mapping[str, Any]) -> int:
        batch = dict(fields)
        _, n = self.spec.validate(batch)           # raises SpecError naming the field
        if n != 1:
            from ..exceptions import SpecError

            raise SpecError(None, f"add() takes one transition; got a batch of {n} (use ingest)")
        return self.ingest(batch)

    # --- sampling ------------------------------------------------------------------------
    def _count_ingest(self, t0: float) -> None:
        """Book one ingest call that started at ``t0`` (under the plane's lock)."""
        t1 = time.perf_counter()
        cnt = self._counters
        cnt["ingest_calls"] += 1
        cnt["ingest_s"] += t1 - t0
        if self._t_first is None:
            self._t_first = t0
        self._t_last = t1

    def _device_rows(self, slots: np.ndarray) -> tuple[Any, np.ndarray] | None:
        """``(device storage, rows)`` if every slot lives in the same GPU tier, else None."""
        st = self.storage
        if not isinstance(st, TieredStorage) or len(slots) == 0:
            return None
        tiers = st.tier_of[slots]
        k = int(tiers[0])
        s = st.storages[k]
        if s.kind != "device" or not getattr(s, "_on_gpu", False) or not (tiers == k).all():
            return None
        return s, st.row_of[slots]

    def _draw(self, batch_size: int, out: np.ndarray | None = None,
              times: dict[str, float] | None = None,
              device_ok: bool = False) -> tuple[Any, np.ndarray, Any]:
        """Sample and gather under the lock: ``(records, keys, weights)``.

        With ``device_ok``, a batch whose rows all live in one GPU tier is gathered on the
        device and returned as a ``(n, itemsize)`` uint8 CuPy array instead of host records.
        """
        with self._lock:
            t0 = time.perf_counter()
            size = self.size
            if size == 0:
                raise EmptyPlaneError()
            slots, keys, weights = self.sampler.draw(self.total, size, batch_size, self.rng)
            t1 = time.perf_counter()
            dev = self._device_rows(slots) if device_ok else None
            if dev is not None:               # all rows in one GPU tier: gather there
                storage, rows = dev
                rec = storage.gather(rows)
            elif out is None and type(self.storage) is HostStorage:
                rec = self.storage.take(slots)
            else:
                rec = self.spec.empty(batch_size) if out is None else out
                self.storage.read_records(slots, rec)
            t2 = time.perf_counter()
            cnt = self._counters
            cnt["sample_calls"] += 1
            cnt["sampled"] += batch_size
            cnt["sample_s"] += t2 - t0
        if times is not None:
            times["sample"] = t1 - t0
            times["gather"] = t2 - t1
        return rec, keys, weights

    def sample(self, batch_size: int | None = None) -> Batch:
        """Sample one batch now, in this thread, as numpy arrays (no rate limiting).

        Field arrays are views of one fresh record buffer (no copies); ``indices`` are keys.
        """
        batch_size = int(config.get("replay.batch-size", batch_size))
        if batch_size < 1:
            raise InputError("batch_size", batch_size, "a positive integer", where="sample")
        rec, keys, weights = self._draw(batch_size)
        return Batch({n: rec[n] for n in self.spec.names}, keys, weights)

    def gather_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records of ``keys`` (any shape, flattened) and a mask of which keys were valid.

        Invalid keys (overwritten or not yet inserted) read an arbitrary valid record; use the
        mask. Used by transforms that look at neighbouring transitions (n-step returns).
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        with self._lock:
            if self.size == 0:
                raise EmptyPlaneError()
            valid = (keys >= self.total - self.size) & (keys < self.total)
            safe = np.where(valid, keys, self.total - 1) % self.capacity
            rec = self.spec.empty(len(keys))
            self.storage.read_records(safe, rec)
        return rec, valid

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set new priorities for the transitions with keys ``indices`` (from ``batch.indices``).

        Accepts numpy, torch or CuPy arrays. Keys of transitions that were overwritten since
        they were sampled are skipped. Returns how many priorities were applied. A no-op for
        samplers without priorities.
        """
        from .spec import priority_arrays

        keys, pr = priority_arrays(indices, priorities, where="update_priorities")
        if not self.sampler.prioritized:
            return 0
        with self._lock:
            valid = (keys >= self.total - self.size) & (keys < self.total)
            if not valid.all():
                self._counters["stale_updates"] += int((~valid).sum())
                keys, pr = keys[valid], pr[valid]
            self.sampler.update(keys % self.capacity, pr)
            self._counters["priority_updates"] += len(keys)
        if self._placement is not None:
            self._dirty.set()
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

        ``switch_interval`` (default ``research.replay.switch-interval``, 100 us) lowers the
        interpreter's thread switch interval while a prefetching iterator is open, so that the
        learner never waits the default 5 ms for the GIL held by the delivery thread; ``None``
        in the config leaves the interpreter alone.

        ``bool_as`` (e.g. ``"float32"``) delivers every bool field (stored ones and those
        transforms add) as 0/1 numbers of that dtype, so that a torch learner can write
        ``1 - done`` (``torch.bool`` refuses subtraction). Default ``None``: fields come out in
        their stored dtype; a field stored as float stays float.

        With ``prefetch > 0``, a learner that asks for a batch while the delivery thread has none
        ready or in progress gets one made in its own thread (the next draw: the seeded sequence
        of batches is the same); this needs no user transforms and no rate limiter, and output
        to numpy or torch on CPU.
        """
        from .delivery import BatchIterator, tensordict_output

        wrap, to = tensordict_output(to)
        it = BatchIterator(self, batch_size=batch_size, prefetch=prefetch, to=to, device=device,
                           transforms=transforms, max_batches=max_batches, timeout=timeout,
                           switch_interval=switch_interval, bool_as=bool_as)
        self._deliveries = [d for d in self._deliveries if not d.closed][-7:] + [it]
        return wrap(it)

    # --- placement -----------------------------------------------------------------------
    def _valid_keys(self, keys: np.ndarray) -> np.ndarray:
        return (keys >= self.total - self.size) & (keys < self.total)

    def rebalance(self, max_moves: int | None = None) -> int:
        """Move misplaced transitions to their target tiers now; returns how many moved.

        The plan is computed from a snapshot without blocking ingest or sampling; the lock is
        held only while the moves (at most ``max_moves``, hottest first) are copied.
        """
        if self._placement is None:
            return 0
        self._dirty.clear()
        with self._lock:
            slots, keys = self._valid()
            heat = np.array(self.sampler.heat(slots, keys), dtype=np.float64, copy=True)
            current = self.storage.tier_of[slots]
        return self._placement.rebalance(slots, keys, heat, current, self._lock,
                                         self._valid_keys, max_moves)

    def rebalance_pending(self) -> bool:
        """Whether the last background round left misplaced transitions (cheap estimate)."""
        return self._placement is not None and self._placement.last_left > 0

    def placement(self) -> PlacementReport:
        """What lives in which tier and why (print it)."""
        with self._lock:
            slots, keys = self._valid()
            if self._placement is not None:
                return self._placement.report(slots, keys)
            s = self.storage
            tier = TierPlacement(name=s.name, kind=s.kind, bandwidth=float("nan"),
                                 bandwidth_declared=False, capacity_bytes=s.nbytes, rows=s.rows,
                                 used=self.size,
                                 heat_min=float(keys[0]) if len(keys) else float("nan"),
                                 heat_max=float(keys[-1]) if len(keys) else float("nan"),
                                 sample_share=1.0 if self.size else 0.0)
            return PlacementReport(policy=self.sampler.policy,
                                   reason="one host tier: every transition lives in host memory",
                                   tiers=[tier])

    def _start_migrator(self) -> None:
        def loop() -> None:
            while not self._closed.is_set():
                if not self._dirty.wait(0.5):
                    continue
                if self._closed.wait(self.migrate_interval):
                    break
                try:
                    self.rebalance(self.migrate_batch)
                    if self.rebalance_pending():
                        self._dirty.set()         # more to move: go on next round
                except Exception:  # pragma: no cover - keep serving; the next round retries
                    time.sleep(self.migrate_interval)

        self._migrator = threading.Thread(target=loop, name="replay-migrate", daemon=True)
        self._migrator.start()

    # --- statistics ----------------------------------------------------------------------
    def stats(self) -> PlaneStats:
        """Counters, rates, tier occupancy and delivery figures (exposed latency, stages)."""
        with self._lock:
            cnt = dict(self._counters)
            span = (self._t_last - self._t_first) if self._t_first is not None else 0.0
            if isinstance(self.storage, TieredStorage):
                occ = self.storage.occupancy()
                tiers = [{"name": t.name, "kind": s.kind, "used": u, "rows": s.rows,
                          "bytes_used": u * self.spec.itemsize, "capacity_bytes": s.nbytes,
                          "bandwidth": bw}
                         for t, s, u, bw in zip(self.storage.tiers, self.storage.storages, occ,
                                                self.storage.bandwidths)]
                moved = self.storage.moves
            else:
                s = self.storage
                tiers = [{"name": s.name, "kind": s.kind, "used": self.size, "rows": s.rows,
                          "bytes_used": self.size * self.spec.itemsize,
                          "capacity_bytes": s.nbytes, "bandwidth": None}]
                moved = 0
        out: dict[str, Any] = {
            "size": self.size, "capacity": self.capacity, "inserted": self.total,
            "sampled": cnt["sampled"], "ingest_calls": cnt["ingest_calls"],
            "sample_calls": cnt["sample_calls"],
            "ingest_rate": self.total / span if span > 0 else float("nan"),
            "ingest_busy_rate": self.total / cnt["ingest_s"] if cnt["ingest_s"] else float("nan"),
            "sample_busy_rate": cnt["sampled"] / cnt["sample_s"] if cnt["sample_s"] else float("nan"),
            "priority_updates": cnt["priority_updates"], "stale_priority_updates": cnt["stale_updates"],
            "tiers": tiers, "migrated": moved,
        }
        if self.rate_limiter is not None:
            rl = self.rate_limiter
            out["rate_limiter"] = {"inserts": rl.inserts, "samples": rl.samples, "diff": rl.diff,
                                   "waited_insert_s": rl.waited["insert"],
                                   "waited_sample_s": rl.waited["sample"]}
        if self._deliveries:
            out["delivery"] = self._deliveries[-1].stats.summary()
        return PlaneStats(out)

    # --- snapshots and checkpoints -------------------------------------------------------
    def snapshot(self, chunk: int = 16_384) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A consistent copy of the plane: ``(meta, arrays)``, JSON-able meta and numpy arrays.

        The plane's lock is held only to read the counters and then for each chunk of
        ``chunk`` records, so ingest waits at most one chunk copy. Records are copied newest
        first; transitions that ingest overwrites meanwhile (the oldest) are left out, so the
        snapshot holds the newest transitions as of its start, minus those.
        """
        chunk = max(1, int(chunk))
        cap = self.capacity
        with self._lock:
            total0, size0 = self.total, self.size
            free0 = cap - size0
            sampler_meta = {k: v for k, v in self.sampler.state_dict().items()
                            if not isinstance(v, np.ndarray)}
            rng_state = self.rng.bit_generator.state
            limiter = self.rate_limiter.state_dict() if self.rate_limiter is not None else None
        parts: list[np.ndarray] = []
        leaf_parts: list[np.ndarray] = []
        hi, lo_valid = size0, 0
        while hi > lo_valid:
            with self._lock:
                overwritten = max(0, (self.total - total0) - free0)
                lo_valid = max(lo_valid, overwritten)
                lo = max(hi - chunk, lo_valid)
                if lo >= hi:
                    break
                slots = (np.arange(lo, hi, dtype=np.int64) + (total0 - size0)) % cap
                buf = self.spec.empty(hi - lo)
                self.storage.read_records(slots, buf)
                if self.sampler.prioritized:
                    leaf_parts.append(self.sampler.tree.sum[slots + self.sampler.tree.L].copy())
            parts.append(buf)
            hi = lo
        records = np.concatenate(parts[::-1]) if parts else self.spec.empty(0)
        n = len(records)
        meta = {
            "format": FORMAT, "version": FORMAT_VERSION, "spec": self.spec.to_dict(),
            "capacity": cap, "total": total0, "count": n, "first_key": total0 - n,
            "sampler": {"class": type(self.sampler).__name__, "state": sampler_meta},
            "rng": {"bit_generator": rng_state["bit_generator"], "state": rng_state},
            "rate_limiter": limiter, "created": time.time(),
        }
        arrays = {f"field.{name}": np.ascontiguousarray(records[name]) for name in self.spec.names}
        if self.sampler.prioritized:
            arrays["sampler.leaf"] = (np.concatenate(leaf_parts[::-1]) if leaf_parts
                                      else np.zeros(0))
        return json.loads(json.dumps(meta)), arrays

    def load_snapshot(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                      where: str = "snapshot") -> None:
        """Replace the contents with a :meth:`snapshot` (same spec; capacity may differ)."""
        if meta.get("format") != FORMAT:
            raise CheckpointError(where, f"not a {FORMAT} checkpoint (format={meta.get('format')!r})")
        if meta.get("version") != FORMAT_VERSION:
            raise CheckpointError(where, f"format version {meta.get('version')!r}; this "
                                         f"dask-research reads version {FORMAT_VERSION}")
        spec = ExperienceSpec({k: (tuple(s), d) for k, (s, d) in meta["spec"].items()})
        if spec != self.spec:
            raise CheckpointError(where, f"spec {spec} differs from the plane's {self.spec}")
        from .checkpoints import check_snapshot
        check_snapshot(self.spec, meta, arrays, where)     # what ingest checks, and exact dtypes
        n, first, total = int(meta["count"]), int(meta["first_key"]), int(meta["total"])
        try:
            fields = {name: np.asarray(arrays[f"field.{name}"]) for name in spec.names}
        except KeyError as e:
            raise CheckpointError(where, f"array {e.args[0]!r} is missing")
        if any(len(a) != n for a in fields.values()):
            raise CheckpointError(where, f"field arrays do not all hold {n} transitions")
        cap = self.capacity
        if n > cap:           # restoring into a smaller plane keeps the newest
            fields = {k: v[n - cap:] for k, v in fields.items()}
            first += n - cap
            n = cap
        leaf = None
        if self.sampler.prioritized and "sampler.leaf" in arrays:
            leaf = np.asarray(arrays["sampler.leaf"], dtype=np.float64)[-n:] if n else np.zeros(0)
        with self._lock:
            if self.sampler.prioritized:
                self.sampler.tree.load(np.zeros(cap))
                st = meta["sampler"]["state"]
                if meta["sampler"]["class"] == type(self.sampler).__name__:
                    self.sampler.max_priority = float(st.get("max_priority", 1.0))
            self.total, self.size = first, 0
            done = 0
            while done < n:
                c = (first + done) % cap
                m = min(n - done, cap - c)
                self.storage.write_fields(c, {k: v[done:done + m] for k, v in fields.items()})
                self.sampler.on_insert(c, m)
                done += m
            self.total, self.size = total, n
            if leaf is not None and n:
                slots = (np.arange(first, first + n, dtype=np.int64)) % cap
                self.sampler.tree.set(slots, leaf, np.where(leaf > 0, leaf, np.inf))
            rng = meta.get("rng")
            if rng and rng.get("bit_generator") == self.rng.bit_generator.state["bit_generator"]:
                self.rng.bit_generator.state = rng["state"]
            if self.rate_limiter is not None and meta.get("rate_limiter"):
                self.rate_limiter.load_state_dict(meta["rate_limiter"])
        if self._placement is not None:
            self._dirty.set()

    def checkpoint(self, path: str | os.PathLike, chunk: int = 16_384,
                   extra: Mapping[str, Any] | None = None) -> pathlib.Path:
        """Commit the plane to checkpoint directory ``path`` in one atomic step.

        The snapshot (see :meth:`snapshot`; ingest waits at most one chunk copy at a time) is
        written as a new version directory, ``data.npz`` (no pickle) and ``meta.json``, and
        committed by replacing the ``CURRENT`` pointer; older versions are removed after the
        commit (see :mod:`~dask_research.replay.checkpoints`). A crash at any point leaves the
        previous checkpoint restorable, or the new one complete. ``extra`` (JSON-able) is stored
        in the metadata as ``meta["extra"]``. Returns ``path``.
        """
        self._checkpoint(path, chunk, extra)
        return pathlib.Path(path)

    def _checkpoint(self, path: str | os.PathLike, chunk: int = 16_384,
                    extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], pathlib.Path]:
        """:meth:`checkpoint`, returning ``(meta as written, committed version directory)``."""
        from . import checkpoints

        meta, arrays = self.snapshot(chunk)
        if extra is not None:
            meta["extra"] = json.loads(json.dumps(dict(extra)))
        version = checkpoints.write(path, meta, arrays)
        return meta, version

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
        try:
            return cls._restore(pathlib.Path(path), tiers, sampler, rate_limiter, **kwargs)
        except CheckpointError:
            raise
        except (ResearchError, KeyError, TypeError, ValueError, AttributeError, IndexError,
                OverflowError, EOFError, OSError, RecursionError, SyntaxError) as e:
            raise CheckpointError(str(path), f"malformed checkpoint ({type(e).__name__}: {e})") from None

    @classmethod
    def _restore(cls, path: pathlib.Path, tiers, sampler, rate_limiter, **kwargs: Any) -> ExperiencePlane:
        from . import checkpoints

        meta, where = checkpoints.read_meta(path)
        if meta.get("format") != FORMAT:
            raise CheckpointError(str(path), f"not a {FORMAT} checkpoint")
        if sampler is None:
            info = meta["sampler"]
            klass = _SAMPLERS.get(info["class"])
            if klass is None:
                raise CheckpointError(str(path), f"sampler {info['class']!r} is not built in; "
                                      "pass sampler=... to restore")
            st = info["state"]
            if klass is PrioritizedSampler:
                sampler = PrioritizedSampler(alpha=st["alpha"], beta=st["beta"], eps=st["eps"],
                                             shuffle=st.get("shuffle", True))
            elif klass is RecentSampler:
                sampler = RecentSampler(window=st["window"])
            else:
                sampler = klass()
        spec = ExperienceSpec({k: (tuple(s), d) for k, (s, d) in meta["spec"].items()})
        capacity = meta.get("capacity") if tiers is None else kwargs.pop("capacity", None)
        if tiers is None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise CheckpointError(where, f"capacity {capacity!r} is not a positive whole number")
        plane = cls(spec, capacity, tiers=tiers, sampler=sampler, rate_limiter=rate_limiter, **kwargs)
        try:
            meta, arrays, _ = checkpoints.load(path, where)       # the same version
            plane.load_snapshot(meta, arrays, where=str(path))
        except BaseException:
            plane.close()
            raise
        return plane

    def contents(self) -> dict[str, np.ndarray]:
        """All stored transitions, oldest first, as numpy arrays (a copy; for tests and export)."""
        meta, arrays = self.snapshot()
        return {name: arrays[f"field.{name}"] for name in self.spec.names}

    # --- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop background threads and delivery pipelines; release tiers (disk files)."""
        self._closed.set()
        for d in self._deliveries:
            d.close()
        if self._publisher is not None:
            self._publisher.stop()
        if self._migrator is not None:
            self._migrator.join(timeout=5)
        self.storage.close()

    def __enter__(self) -> ExperiencePlane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ExperiencePlane(size={self.size:,}/{self.capacity:,}, storage={self.storage!r}, "
                f"sampler={self.sampler!r})")
