"""Cluster delivery: batches sampled across worker shards, fetched ahead as Dask futures.

:meth:`ClusterPlane.batches` returns a :class:`ClusterBatchIterator`. A background thread keeps
a window of *requests* in flight; a request is one batch, split over the live shards by a
multinomial draw in proportion to their sampling mass (the number of transitions for uniform
sampling, the sum of priority leaves for prioritized sampling), one ``shard_ops.sample`` task
per remote shard pinned to its worker (``workers=[address]``), and an in-process draw for the
learner's own shard when the learner runs on a worker (no task, no network: local data is
preferred by serving it locally). Finished batches wait in a bounded queue of ``prefetch``;
``next()`` takes one, and the time it blocks is the exposed latency, recorded exactly as in
the single-process plane (:class:`~dask_research.replay.DeliveryStats`).

**How far ahead** (the bandwidth rule). Before each refill the window is sized as::

    depth = ceil((rtt + bytes_per_batch / bandwidth) / step) + 1

counted in requests of ``group`` batches each (``step`` and ``bytes_per_batch`` scale with
the group), clamped to ``[1, max(2, max_in_flight // group)]`` (``max_in_flight`` counts
batches) and to ``max_in_flight_bytes / bytes_per_batch``, where
``rtt`` is the measured mean round trip of a sample task (submit to result, an exponential
moving average), ``bytes_per_batch`` the remote part of a batch, ``bandwidth`` Dask's own
measured bandwidth of the workers that hold the shards (``Scheduler.bandwidth_workers``, else
``Scheduler.bandwidth``, refreshed with the shard table) and ``step`` the learner's mean step
time. A fast learner or a slow link asks for more requests in flight, a slow learner fewer.
When one request costs the cluster more than a learner step (``service = rtt / in flight``,
Little's law), a request carries ``group = ceil(1.25 * service / step)`` batches, at most
``research.replay.cluster.max-group``, so the task rate stays below what the scheduler can
serve (:func:`request_group`).

**Prioritized weights across shards.** A shard returns the priority leaves ``p_i^alpha`` of
its samples; with masses ``M_s`` and ``M = sum M_s``, a transition is drawn with probability
``p_i^alpha / M`` and its weight is ``(p_i^alpha / min_leaf)^-beta`` with ``min_leaf`` the
smallest leaf over all live shards, so the largest possible weight is 1 as on one process.

**Faults.** A request whose shard died (its task failed, or the worker left the scheduler) is
discarded and the batch is drawn again from the shards that remain; the shard table marks the
shard lost and the plane logs an event. Delivery never waits for a dead worker longer than
``stall`` seconds before re-checking the scheduler's worker list. When every shard is lost,
``next()`` raises :class:`~dask_research.replay.ShardsLostError` at once, naming the shards,
their workers and the transitions lost (live shards that are merely empty are waited for, up
to ``research.replay.rate-timeout``, as actors may still be starting).
"""
from __future__ import annotations

import collections
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ... import config
from ..batch import Batch
from ..experience_plane import EmptyPlaneError
from ..local_delivery import (
    _STOP,
    DeliveryStats,
    PrefetchingIterator,
    _acquire_switch_interval,
    make_converter,
    whole_number,
)
from .router import PriorityRouter
from .table import ShardTable
from .waiting import wait_all


def prefetch_depth(rtt: float, bytes_per_batch: float, bandwidth: float, step: float,
                   max_in_flight: int, max_bytes: float) -> int:
    """Requests to keep in flight (see the module docstring for the rule).

    >>> prefetch_depth(rtt=0.004, bytes_per_batch=1e6, bandwidth=1e9, step=0.002,
    ...                max_in_flight=16, max_bytes=64e6)
    4
    >>> prefetch_depth(0.004, 1e6, 1e9, step=float("nan"), max_in_flight=16, max_bytes=64e6)
    16
    """
    cap = max(1, min(int(max_in_flight), int(max_bytes // max(bytes_per_batch, 1.0))))
    if not step > 0 or not math.isfinite(step):
        return cap                              # unknown learner speed: fill the window
    lead = rtt + (bytes_per_batch / bandwidth if bandwidth > 0 else 0.0)
    return max(1, min(cap, math.ceil(lead / step) + 1))


def request_group(service: float, step: float, max_group: int) -> int:
    """Batches per request so that requests arrive faster than the learner uses them.

    A sample task costs ``service`` seconds of the cluster's throughput (measured: round trip
    divided by the requests in flight, Little's law); if that exceeds the learner's ``step``,
    one request carries ``ceil(1.25 * service / step)`` batches (at most ``max_group``).

    >>> request_group(service=0.006, step=0.002, max_group=32)
    4
    >>> request_group(service=0.001, step=0.002, max_group=32)
    1
    """
    if not (service > 0 and step > 0 and math.isfinite(service) and math.isfinite(step)):
        return 1
    return max(1, min(int(max_group), math.ceil(1.25 * service / step)))


class _Request:
    __slots__ = ("parts", "local", "t0", "counts", "inflight")

    def __init__(self, counts: list[dict[int, int]], inflight: int) -> None:
        self.parts: dict[int, Any] = {}      # shard id -> future
        self.local: int | None = None        # shard id served in-process
        self.counts = counts                 # one {shard id: n} per batch of the request
        self.inflight = inflight
        self.t0 = time.perf_counter()


class ClusterBatchIterator(PrefetchingIterator):
    """Iterator over batches drawn from all shards; see :meth:`ClusterPlane.batches`.

    It draws through ``table`` (a :class:`~dask_research.replay.cluster.table.ShardTable`:
    allocation, sample tasks, assembly, loss), lets ``router`` (a
    :class:`~dask_research.replay.cluster.router.PriorityRouter`) ship queued priority
    updates, and calls ``upkeep`` before each refill and while the learner is behind (the
    plane's periodic refresh and rebalance; default ``table.maybe_refresh``).

    >>> it = ClusterBatchIterator(table, router, batch_size=256)     # doctest: +SKIP
    >>> next(it).indices.shape                                        # doctest: +SKIP
    (256,)
    """

    def __init__(self, table: ShardTable, router: PriorityRouter, batch_size: int | None = None,
                 prefetch: int | None = None, to: str = "numpy", device: Any = None,
                 max_batches: int | None = None, max_in_flight: int | None = None,
                 switch_interval: float | None = None,
                 upkeep: Callable[[], Any] | None = None):
        self.table = table
        self.router = router
        self.upkeep = upkeep if upkeep is not None else table.maybe_refresh
        self.batch_size = whole_number("batch_size", config.resolve("replay.batch-size", batch_size),
                                       1, "a positive integer")
        self.prefetch = whole_number("prefetch", config.resolve("replay.prefetch", prefetch), 1,
                                     "an integer >= 1 (cluster delivery always fetches ahead; use "
                                     "plane.sample() for one synchronous batch)")
        self.max_in_flight = int(config.resolve("replay.cluster.max-in-flight", max_in_flight))
        self.max_bytes = float(config.resolve("replay.cluster.max-in-flight-bytes"))
        self.stall = float(config.resolve("replay.cluster.stall"))
        self.timeout = float(config.resolve("replay.rate-timeout"))
        self.max_batches = (None if max_batches is None else
                            whole_number("max_batches", max_batches, 0, "None or an integer >= 0"))
        self.convert = make_converter(table.spec, to, device, self.prefetch + 2, self.batch_size)
        self.stats = DeliveryStats(self.prefetch)
        self.max_group = int(config.resolve("replay.cluster.max-group"))
        self.rtt = float("nan")
        self.service = float("nan")       # Little's law: seconds per request at this depth
        self.depth = 1
        self.group = 1
        self.discarded = 0
        self.local_draws = 0              # shard parts drawn in-process (learner on a worker)
        self.remote_tasks = 0             # sample tasks submitted
        self._produced = 0
        self._step_ema = float("nan")
        self._last_return: float | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._stop = threading.Event()
        self.closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=self.prefetch)
        si = config.resolve("replay.switch-interval", switch_interval, default=None)
        self._switch = _acquire_switch_interval(si)
        self._thread = threading.Thread(target=self._run, name="replay-cluster-delivery",
                                        daemon=True)
        self._thread.start()

    # --- requests ------------------------------------------------------------------------
    def _bytes_per_batch(self) -> float:
        return self.batch_size * self.table.spec.itemsize * self.table.remote_share()

    def _target_depth(self) -> int:
        rtt = self.rtt if math.isfinite(self.rtt) else 0.005
        self.group = request_group(self.service, self._step_ema, self.max_group)
        self.depth = prefetch_depth(rtt, self.group * self._bytes_per_batch(),
                                    self.table.bandwidth(), self.group * self._step_ema,
                                    max(2, self.max_in_flight // self.group), self.max_bytes)
        return self.depth

    def _submit(self) -> _Request:
        table = self.table
        counts = [table.allocate(self.batch_size) for _ in range(self.group)]
        req = _Request(counts, len(self._pending) + 1)
        total: dict[int, int] = {}
        for c in counts:
            for sid, n in c.items():
                total[sid] = total.get(sid, 0) + n
        for sid, n in total.items():
            ref = table[sid]
            if table.is_local(ref):
                req.local = sid
                self.local_draws += 1
            else:
                req.parts[sid] = table.sample_future(ref, n)
                self.remote_tasks += 1
        return req

    def _collect(self, req: _Request) -> list[Batch] | None:
        """Wait for ``req``; None if a shard it used was lost (its batches are drawn again)."""
        table = self.table
        futures = list(req.parts.values())
        waited = 0.0

        def drop_if_lost() -> bool:
            if not all(table[s].usable for s in req.parts):     # lost, or its worker frozen
                for f in futures:
                    f.cancel()
                return True
            return False

        while futures:
            if drop_if_lost():               # a shard of this request died: draw it again
                return None
            if wait_all(futures, timeout=min(self.stall, 0.25)):
                break
            waited += min(self.stall, 0.25)
            if self._stop.is_set():
                return None
            if waited >= self.stall:
                table.refresh()
                waited = 0.0
        replies: dict[int, dict] = {}
        for sid, fut in req.parts.items():
            if fut.status != "finished":
                table.check_failure(sid, fut)
                return None
            try:          # the result may be lost with its worker in the meantime
                replies[sid] = fut.result(timeout=self.stall)
            except Exception:
                table.check_failure(sid, fut)
                return None
        t_done = time.perf_counter()
        if req.parts:
            rt = t_done - req.t0
            svc = rt / req.inflight
            self.rtt = rt if not math.isfinite(self.rtt) else 0.8 * self.rtt + 0.2 * rt
            self.service = (svc if not math.isfinite(self.service)
                            else 0.8 * self.service + 0.2 * svc)
        if req.local is not None:
            n = sum(c.get(req.local, 0) for c in req.counts)
            replies[req.local] = table.sample_local(n)
        out = []
        offset = dict.fromkeys(replies, 0)
        for counts in req.counts:            # split each shard's reply over the batches
            parts = []
            for sid, n in counts.items():
                r, o = replies[sid], offset[sid]
                cut = {k: None if r[k] is None else r[k][o:o + n]
                       for k in ("records", "keys", "leaf")}
                parts.append((sid, {**r, **cut}))
                offset[sid] = o + n
            b = table.assemble(parts, self.batch_size)
            if b is None:
                return None
            out.append(b)
        return out

    def _run(self) -> None:
        table = self.table
        empty_since: float | None = None
        try:
            while not self._stop.is_set():
                if self.max_batches is not None and self._produced >= self.max_batches:
                    self._put(_STOP)
                    return
                self.upkeep()
                self.router.ship(force=False)
                want = self._target_depth()
                if self.max_batches is not None:
                    want = min(want, -(-(self.max_batches - self._produced) // self.group))
                while len(self._pending) < want and not self._stop.is_set():
                    try:
                        self._pending.append(self._submit())
                        empty_since = None
                    except EmptyPlaneError:        # actors ingest behind our back: look again
                        if self._pending:
                            break
                        empty_since = empty_since or time.monotonic()
                        if time.monotonic() - empty_since > self.timeout:
                            raise
                        table.refresh()
                        time.sleep(0.05)
                if not self._pending:
                    continue
                req = self._pending.popleft()
                batches = self._collect(req)
                if batches is None:
                    self.discarded += len(req.counts)
                    continue
                for batch in batches:
                    if self.max_batches is not None and self._produced >= self.max_batches:
                        break
                    self._produced += 1
                    self._put(batch)
        except BaseException as e:  # forwarded to the learner's next()
            self._put(e)
        finally:
            for req in self._pending:
                for f in req.parts.values():
                    f.release()
            self._pending.clear()

    def _on_full(self) -> None:
        """While the learner is behind, priority updates and the shard table still move."""
        self.router.ship(force=False)
        self.upkeep()

    # --- iterator ------------------------------------------------------------------------
    def __next__(self) -> Batch:
        if self.closed:
            raise StopIteration
        t_call, step = self._clock()
        if step is not None:
            self._step_ema = step if not math.isfinite(self._step_ema) else (
                0.9 * self._step_ema + 0.1 * step)
        item = self._take()
        return self._hand_over(self.convert(None, item), t_call, step, item.info)

    def summary(self) -> dict[str, Any]:
        """Delivery figures: the single-process summary plus depth, round trip, discards."""
        out = self.stats.summary()
        out.update({"in_flight_depth": self.depth, "group": self.group, "rtt_s": self.rtt,
                    "request_service_s": self.service,
                    "discarded_batches": self.discarded, "local_draws": self.local_draws,
                    "remote_tasks": self.remote_tasks})
        return out

