"""The execution loop of a run: windowed blocks, the fixed tree folded as blocks arrive, checks.

Blocks of shards are submitted at most ``window`` at a time (the client and scheduler never
hold a future per shard), blocks holding the first verification shards first, so their checks
overlap the run. When a block finishes, the driver gathers its result (the block's folded
state, and the few shard states verification keeps; where the store is reachable from the
workers the block task has written its shard file itself and sends the file's checksum, else
every shard's state comes back and the driver writes it, see :mod:`.blocks`), and folds
the fixed tree: every merge whose two children exist is done at once, so the root exists the
moment the last block arrives. The driver holds these states anyway, so a merge costs it a few
microseconds where a merge task would cost a scheduler round trip (and, for the last levels, a
chain of them after the last block). Near the end, a block running far longer than the median
is duplicated on another worker; the first finisher wins (shards are deterministic, so either
is right). Before the result is accepted, shards are recomputed on other workers and compared;
a mismatch quarantines the faulty worker's shards, which are recomputed elsewhere. Events go
to the scheduler's log through an ordered outbox, off the driver's path.

Nothing waits without a bound: a block running longer than ``research.montecarlo.
block-timeout`` fails the run with a :class:`PipelineError` naming its shards, worker and
elapsed time; a check that does not finish within ``research.montecarlo.check-timeout`` moves to
another worker; a block that fails on one worker is tried on another (up to
``research.montecarlo.pipeline-attempts`` workers); a lost scheduler becomes a
:class:`ResearchError` saying what is stored and that the same command resumes. A failing run
logs a ``failed`` event with its reason.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config
from .._cluster import workers_info
from ..exceptions import ConfigError, PipelineError, ResearchError, VerificationError
from .accumulators import Moments
from .blocks import compute_and_store_block, store_target
from .events import EventOutbox, RunningEstimate
from .shard import BlockResult, compute_block, compute_shard
from .tree import block_bounds, tree_fold
from .verify import TOLERANCE, choose_reused, choose_shards, hash_order, reused_count, states_match

__all__ = ["Execution"]


def verify_shard(job, reducer, shard: int) -> tuple[Any, str]:
    """Recompute one shard (a verification task); returns the state and the worker."""
    from .shard import _worker_address

    return compute_shard(job, shard, reducer=reducer), _worker_address()


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


def _seconds_setting(key: str) -> float | str | None:
    """``research.montecarlo.<key>``: ``None`` (no limit), ``"auto"``, or positive seconds."""
    from dask.utils import parse_timedelta

    value = config.get(f"montecarlo.{key}")
    if value is None or value == "auto":
        return value
    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise ConfigError(f"montecarlo.{key}", value, '"auto", a positive duration (seconds, or "90s", '
                          '"5 minutes"), or null (no limit)')
    return float(seconds)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


#: The reason Dask gives the futures it cancels when a client loses its scheduler.
LOST = "scheduler-connection-lost"


def _lost_scheduler(client, exc: BaseException) -> bool:
    """Whether ``exc`` (raised while a run waited on ``client``) means the scheduler is gone."""
    from distributed.client import FutureCancelledError, FuturesCancelledError
    from distributed.comm.core import CommClosedError

    if isinstance(exc, (ResearchError, KeyboardInterrupt)):
        return False
    if isinstance(exc, FutureCancelledError) and getattr(exc, "reason", None) == LOST:
        return True
    if isinstance(exc, FuturesCancelledError) and any(getattr(g, "reason", None) == LOST
                                                      for g in getattr(exc, "error_groups", [])):
        return True
    if isinstance(exc, CommClosedError):
        return True
    status = getattr(client, "status", "running")
    return status != "running" and isinstance(exc, (OSError, TimeoutError, asyncio.CancelledError,
                                                    concurrent.futures.CancelledError, RuntimeError))


class Execution:
    """One run of a job on a client. Use :meth:`execute`."""

    def __init__(self, client, job, reducer, block: int, *, run_id: str, known=None,
                 known_producers=None, store=None, verify: int = 0, window: int = 64,
                 speculate: float = 0.0, progress=None, poll: float = 0.2,
                 shard_seconds: float | None = None, store_token: str | None = None):
        self.client, self.job, self.reducer, self.block = client, job, reducer, block
        self.run_id, self.store, self.verify_k = run_id, store, int(verify)
        self.window, self.speculate, self.poll = max(1, int(window)), float(speculate or 0.0), poll
        self.progress = progress
        self.known: dict[int, Any] = dict(known or {})
        self.tag = f"{run_id[:12]}-{uuid.uuid4().hex[:6]}"
        self.bounds = block_bounds(job.shards, block)
        self.sizes = [len(self.bounds)]
        while self.sizes[-1] > 1:
            self.sizes.append((self.sizes[-1] + 1) // 2)
        # Producer of each shard, compactly: index into self.worker_names (-1 unknown).
        self.worker_names: list[str] = []
        self.producer = np.full(job.shards, -1, dtype=np.int32)
        for s, w in (known_producers or {}).items():
            self.producer[s] = self._wid(w)
        self.block_states: dict[int, Any] = {}
        self.nodes: dict[tuple[int, int], Any] = {}
        self.pending: dict[Any, int] = {}            # block future -> block index
        self.leaf_futures: dict[int, list] = {}
        self.end_seen: dict[int, float] = {}
        self.durations: list[float] = []
        self.root: Any = None
        self.tree_enabled = True
        self.outcome = Outcome(reused=len(self.known))
        # States kept for verification: the hashed candidates, and each worker's first shard.
        self.candidates = set(hash_order(run_id, job.shards, self.verify_k + 64)) if self.verify_k else set()
        self.kept: dict[int, Any] = {s: st for s, st in self.known.items() if s in self.candidates}
        # Shards reused from a store are also checked, drawn unpredictably: the hashed picks are
        # public, so a store's editor would otherwise know which shards nobody recomputes.
        from .. import config
        n_reused = reused_count(config.get("montecarlo.verify-reused"), self.verify_k, len(self.known)) \
            if self.verify_k else 0
        self.reused_picks = choose_reused(self.known, n_reused)
        self.kept.update({s: self.known[s] for s in self.reused_picks})
        self.first_of_worker: dict[str, int] = {}
        # The first k hashed shards are checked as soon as they exist, overlapping the run.
        self.early = set(hash_order(run_id, job.shards, self.verify_k)) if self.verify_k else set()
        self.checks: dict[int, tuple[dict, Any]] = {}
        self.estimate = RunningEstimate()
        self.events = EventOutbox(client)
        # Time limits: the pilot's seconds per shard (if the caller passes them) and what blocks take.
        self.pilot_shard_seconds = float(shard_seconds) if shard_seconds else None
        self.shard_times: list[float] = []             # seconds per computed shard, per finished block
        self.block_timeout = _seconds_setting("block-timeout")
        self.check_timeout = _seconds_setting("check-timeout")
        self.attempts = int(config.get("montecarlo.pipeline-attempts"))
        if self.attempts < 1:
            raise ConfigError("montecarlo.pipeline-attempts", self.attempts, "a positive number of workers")
        self.running: dict[str, tuple[float, str]] = {}  # key -> (first seen processing, worker)
        self._watched = 0.0                              # when client.processing() was last read
        self.failed_on: dict[int, dict[str, str]] = {}   # block -> worker -> its error
        self.spec_stopped = False                        # a copy was as slow as its original
        self.check_attempts: dict[int, list] = {}        # shard -> [(future, target, submitted)]
        self.unfetched: dict[str, tuple[float, float]] = {}  # key -> (when a fetch timed out, its bound)
        self._tracked: set[str] = set()                  # block keys whose end wakes _collect (see _track)
        self._wake: asyncio.Event | None = None          # set on the client's loop when a tracked block ends
        # Who writes the shard files: the block tasks when the store is reachable from the
        # workers (each block checks, see .blocks), else the client. The run's lease token is
        # the workers' probe: without one (no lease held) the client writes.
        writes = config.get("montecarlo.store-writes")
        if writes not in ("auto", "client"):
            raise ConfigError("montecarlo.store-writes", writes, '"auto" (the workers write when they can '
                              'reach the store) or "client"')
        self.target = store_target(store, run_id, store_token) if writes == "auto" else None
        self.stored_files: dict[int, tuple[str, str, str]] = {}  # block -> (file, checksum, worker), worker-written
        if store is not None:
            reason = None if self.target is not None else (
                "research.montecarlo.store-writes is client" if writes == "client" else "no lease held on the store")
            self.outcome.store_writes = {"setting": writes, "blocks_by_workers": 0, "blocks_by_client": 0,
                                         "client_reason": reason}

    # -- bookkeeping ------------------------------------------------------------------------
    def _wid(self, worker: str) -> int:
        if worker not in self.worker_names:
            self.worker_names.append(worker)
        return self.worker_names.index(worker)

    def _alive_workers(self) -> list[str]:
        return sorted(workers_info(self.client))

    def _responsive_workers(self) -> list[str]:
        """Workers whose last heartbeat is recent, else every worker the scheduler lists.

        A frozen (SIGSTOP) worker stays in the scheduler's table until its TTL (minutes) but its
        heartbeats stop: a check moved away from a late worker should not land on it. "Recent"
        is within five heartbeat intervals (at least 5 s) of the freshest heartbeat, all read on
        the scheduler's clock.
        """
        info = workers_info(self.client)
        seen = {w: float(i.get("last_seen") or 0.0) for w, i in info.items()}
        if not seen:
            return []
        try:
            from distributed.scheduler import heartbeat_interval  # Dask's own, by cluster size

            beat = float(heartbeat_interval(len(seen)))
        except Exception:  # pragma: no cover - moved in some Dask
            beat = 1.0
        freshest = max(seen.values())
        fresh = [w for w, t in seen.items() if freshest - t < max(5.0, 5 * beat)]
        return sorted(fresh or seen)

    # -- time limits ------------------------------------------------------------------------
    def expected_shard_seconds(self) -> float | None:
        """Seconds one shard is expected to take: the pilot's, or the median finished block's."""
        seen = statistics.median(self.shard_times) if self.shard_times else None
        known = [t for t in (self.pilot_shard_seconds, seen) if t]
        return max(known) if known else None

    def block_limit(self) -> float | None:
        """Seconds a block may run before the run fails (``research.montecarlo.block-timeout``).

        ``auto`` with nothing to expect yet (no pilot timing passed, no block finished) is no
        limit: a run must not fail a block that is merely the first of a slow job.
        """
        if self.block_timeout != "auto":
            return self.block_timeout
        per_shard = self.expected_shard_seconds()
        if per_shard is None:
            return None
        return max(float(config.get("montecarlo.block-timeout-min")),
                   float(config.get("montecarlo.timeout-factor")) * per_shard * self.block)

    def check_limit(self) -> float | None:
        """Seconds a check may take before it moves to another worker."""
        if self.check_timeout != "auto":
            return self.check_timeout
        per_shard = self.expected_shard_seconds() or 0.0
        return max(float(config.get("montecarlo.check-timeout-min")),
                   float(config.get("montecarlo.timeout-factor")) * per_shard)

    def _watch(self, now: float, ending: bool = False) -> dict[str, str] | None:
        """Which pending key runs where, read from the scheduler at most once a second.

        Near the end (``ending``: nothing left to submit, stragglers matter) at most once per
        ``poll``. Records when each key was first seen processing (on which worker); ``None`` if
        not read this time.
        """
        limit = self.block_limit()
        if limit is None and self.speculate <= 0:
            return None
        interval = self.poll if ending else min(1.0, (limit or 10.0) / 10)
        if now - self._watched < interval:
            return None
        self._watched = now
        where = {k: w for w, keys in self.client.processing().items() for k in keys}
        for f in self.pending:
            w = where.get(f.key)
            if w is None:
                continue
            seen = self.running.get(f.key)
            if seen is None or seen[1] != w:          # started, or rescheduled on another worker
                self.running[f.key] = (now, w)
        return where

    def _check_hung(self, now: float) -> None:
        """Fail the run when a block has run longer than the block timeout."""
        limit = self.block_limit()
        if limit is None:
            return
        for idx in sorted(set(self.pending.values())):
            attempts = [self.running[f.key] for f in self.leaf_futures.get(idx, []) if f.key in self.running]
            if not attempts:
                continue
            attempts.sort()
            t0, worker = attempts[0]
            if now - t0 <= limit:
                continue
            a, b = self.bounds[idx]
            shards = f"{a}" if b - a == 1 else f"{a}-{b - 1}"
            copies = "".join(f"; a copy has run {now - t:.1f} s on worker {w}" for t, w in attempts[1:])
            raise PipelineError(shards, (
                f"did not return within {now - t0:.1f} s on worker {worker} (research.montecarlo.block-timeout "
                f"allows {limit:.1f} s; expected about {self._expected_text()}){copies}: a pipeline that hangs "
                "on these shards, or a frozen worker. A thread cannot be killed: that worker's thread stays "
                "busy until the pipeline returns. Stored shards are kept; the same command resumes"))

    def _expected_text(self) -> str:
        per = self.expected_shard_seconds()
        return "unknown (no block finished yet, no pilot timing)" if per is None else \
            f"{per * self.block:.3g} s per block of {self.block}"

    # -- the tree ---------------------------------------------------------------------------
    def _arrive(self, level: int, m: int, node: Any) -> None:
        """Node ``m`` of ``level`` exists: merge it with its sibling if that exists, upward."""
        while True:
            n = self.sizes[level]
            if n == 1:
                self.root = node
                return
            if m == n - 1 and m % 2 == 0:       # an unpaired last node moves up as is
                level, m = level + 1, m // 2
                continue
            sib = m ^ 1
            if (level, sib) not in self.nodes:
                self.nodes[(level, m)] = node
                return
            other = self.nodes.pop((level, sib))
            left, right = (node, other) if m < sib else (other, node)
            node = self.reducer.merge(left, right)
            level, m = level + 1, m // 2

    # -- leaves -----------------------------------------------------------------------------
    def _submit_leaf(self, idx: int, workers=None, speculative: bool = False, retry: int = 0) -> None:
        a, b = self.bounds[idx]
        known = {s: self.known[s] for s in range(a, b) if s in self.known} if self.known else {}
        # Distinct keys for duplicates and recomputations: Dask would hand back a cached value.
        prefix = "mc-spec" if speculative else ("mc-redo" if not self.tree_enabled else "mc-block")
        if retry:
            prefix = f"mc-retry{retry}"
        kw = {"workers": workers, "allow_other_workers": False} if workers else {}
        if self.target is not None or self.store is None:
            # The block's task writes the store, or there is none: only the states the client
            # keeps for verification come back with the block's root (see .blocks).
            keep = tuple(sorted(s for s in self.candidates if a <= s < b))
            fut = self.client.submit(compute_and_store_block, self.job, self.reducer, a, b, known, self.target,
                                     keep, trim=self.store is None, key=f"{prefix}-{self.tag}-{a}-{b}",
                                     pure=False, **kw)
        else:
            fut = self.client.submit(compute_block, self.job, self.reducer, a, b, known,
                                     key=f"{prefix}-{self.tag}-{a}-{b}", pure=False, **kw)
        self.pending[fut] = idx
        self._tracked.add(fut.key)
        self.client.loop.add_callback(self._track, fut)
        self.outcome.max_in_flight = max(self.outcome.max_in_flight, len(self.pending))
        self.leaf_futures.setdefault(idx, []).append(fut)

    def _leaf_done(self, idx: int, fut, res: BlockResult) -> None:
        if idx in self.block_states:
            return  # a speculative twin already won
        for other in self.leaf_futures.pop(idx, []):
            self.running.pop(other.key, None)
            self._tracked.discard(other.key)
            if other is not fut:
                self.pending.pop(other, None)
                other.cancel()
                self.outcome.speculated.append({"block": list(self.bounds[idx]), "winner": res.worker,
                                                "speculative_won": fut.key.startswith("mc-spec")})
        if res.computed and self.store is not None:
            self._record_store(idx, res)
        wid = self._wid(res.worker)
        if res.computed:
            self.producer[np.asarray(res.computed, dtype=np.int64)] = wid
        states = res.shard_states    # a block that wrote the store returns only the few kept here
        small, large = (states, self.candidates) if len(states) < len(self.candidates) else (self.candidates, states)
        for s in [s for s in small if s in large]:
            if s not in self.known:    # computed by this task (a known shard's state is the stored one)
                self.kept[s] = states[s]
        for s in self.early.intersection(res.computed):
            self._submit_check(s, res.worker)
        if res.computed and res.worker not in self.first_of_worker:
            s0 = res.computed[0]
            self.first_of_worker[res.worker] = s0
            self.kept[s0] = res.shard_states[s0]
        if self.known:
            for s in range(*self.bounds[idx]):
                if s in self.known and s in self.candidates:
                    self.kept.setdefault(s, self.known[s])
        self.outcome.computed += len(res.computed)
        self.outcome.workers[res.worker] = self.outcome.workers.get(res.worker, 0) + len(res.computed)
        self.block_states[idx] = res.state
        if res.computed:
            self.durations.append(res.seconds)
            self.shard_times.append(res.seconds / len(res.computed))
        self._emit_accepted(res.start, res.stop, res.worker, len(res.computed), res.state)
        if self.progress is not None:
            self.progress.update(res.stop - res.start)
        if self.tree_enabled:
            self._arrive(0, idx, res.state)

    def _record_store(self, idx: int, res: BlockResult) -> None:
        """The block's computed shards are in the store: written by its task, or now by the client."""
        rec = self.outcome.store_writes
        if res.stored is not None:
            self.stored_files[idx] = (res.stored, res.checksum, res.worker)
            rec["blocks_by_workers"] += 1
            return
        computed = {s: res.shard_states[s] for s in res.computed}
        self.store.write_shards(self.run_id, computed, res.worker, encoder=self._encoder())
        rec["blocks_by_client"] += 1
        if res.store_note and not rec.get("client_reason"):
            rec["client_reason"] = res.store_note

    def _emit_accepted(self, a: int, b: int, worker: str, computed: int, state: Any) -> None:
        data: dict[str, Any] = {"start": a, "stop": b, "worker": worker, "computed": computed}
        if isinstance(state, Moments):
            self.estimate.add(state.n, state.mean, state.m2)
            data.update(n=self.estimate.n, mean=self.estimate.mean, stderr=self.estimate.stderr)
        self.events.emit("accepted", self.run_id, **data)

    def _encoder(self):
        from .codec import encode

        return getattr(self.reducer, "encode", encode)

    # -- stragglers -------------------------------------------------------------------------
    def _maybe_speculate(self, todo: deque) -> None:
        """Watch the blocks in flight: fail the run on a hung one, copy a straggler near the end.

        The driver calls this after every wait. Which block runs where is read from the
        scheduler at most once a second, near the end once per ``poll`` (:meth:`_watch`); a
        block past the block timeout fails the run (:meth:`_check_hung`).

        Speculation starts near the end: nothing left to submit and no unfinished block still
        waiting for a thread (every one has been seen on a worker, or holds a result that could
        not be fetched). Then a block running ``speculate`` median block times is copied to
        another worker: at most one copy of a block, never of a block that has run past half
        the block timeout (it is more likely hung than slow, and a copy would hang a second
        thread), and none at all once a copy was as slow as its original: then the shards are
        slow, not the worker, and copies only take threads from the rest of the cluster.
        """
        now = time.monotonic()
        processing = self._watch(now, ending=not todo)
        self._check_hung(now)
        if self.speculate <= 0 or self.spec_stopped or todo or len(self.durations) < 2:
            return
        unfinished = [i for i in self.leaf_futures if i not in self.block_states]
        if not unfinished or processing is None:
            return
        if any(f.key not in self.running for i in unfinished for f in self.leaf_futures[i]):
            return                  # a block still waits for a thread: not the end yet
        limit = self.speculate * statistics.median(self.durations)
        hung = self.block_limit()
        for idx in unfinished:
            self.end_seen.setdefault(idx, now)
            futs = self.leaf_futures[idx]
            if len(futs) > 1:
                copy = self.running.get(futs[-1].key)
                if copy is not None and now - copy[0] > limit:
                    self.spec_stopped = True
                    a, b = self.bounds[idx]
                    self.events.emit("speculate-stopped", self.run_id, start=a, stop=b, seconds=now - copy[0])
                    return
                continue
            if now - self.end_seen[idx] < limit:
                continue
            seen = self.running.get(futs[0].key)
            if seen is None or (hung is not None and now - seen[0] > hung / 2):
                continue
            where = seen[1]
            others = [w for w in self._alive_workers() if w != where]
            if others:
                self._submit_leaf(idx, workers=others, speculative=True)
                a, b = self.bounds[idx]
                self.events.emit("speculate", self.run_id, start=a, stop=b, slow_worker=where)

    # -- main loop --------------------------------------------------------------------------
    def _drain(self, todo: deque, until) -> None:
        while not until():
            while todo and len(self.pending) < self.window:
                self._submit_leaf(todo.popleft())
            if until():
                break
            if not self.pending:
                raise RuntimeError("internal error: nothing pending but the run is not finished")
            done, values = self.client.sync(self._collect, list(self.pending), self.poll)
            self._raise_if_cancelled([f for f in done if f in self.pending])
            # Only what was gathered is accepted. A future that finished and then lost its data
            # with its worker ("lost": Dask recomputes it) stays pending; one whose speculative
            # twin was accepted a moment ago in this same loop is no longer pending.
            for f, res in values.items():
                if f in self.pending:
                    self._leaf_done(self.pending.pop(f), f, res)
            for f in done:
                if f in self.pending and f.status == "error":
                    self._leaf_failed(self.pending.pop(f), f)
            self._maybe_speculate(todo)

    def _raise_if_cancelled(self, done: list) -> None:
        """A future of the run was cancelled, not by the run: the scheduler is gone, or someone.

        Dask cancels every future when the client loses the scheduler (reason
        ``scheduler-connection-lost``); that becomes the lost-scheduler error in :meth:`execute`.
        Any other cancellation (another client, the dashboard) fails the run saying so.
        """
        cancelled = [f for f in done if f.status == "cancelled"]
        if not cancelled:
            return
        from distributed.client import FutureCancelledError

        err: FutureCancelledError | None = None
        try:
            cancelled[0].result(timeout=1)
        except FutureCancelledError as e:
            err = e
        except Exception:
            pass
        reason = getattr(err, "reason", None)
        if reason == LOST or getattr(self.client, "status", "running") != "running":
            raise err or FutureCancelledError(cancelled[0].key, reason=LOST)
        keys = ", ".join(str(f.key) for f in cancelled[:3])
        raise ResearchError(f"run {self.run_id[:12]}: task {keys} was cancelled from outside the run "
                            f"(reason: {reason or 'not given'}); stored shards are kept and the same "
                            "command resumes")

    def _leaf_failed(self, idx: int, fut) -> None:
        """A block's task raised: try it on a worker it has not failed on, or fail the run."""
        exc, tb = fut.exception(), fut.traceback()
        seen = self.running.pop(fut.key, None)
        worker = getattr(exc, "worker", None) or (seen[1] if seen else "an unknown worker")
        failures = self.failed_on.setdefault(idx, {})
        failures[worker] = _one_line(exc)
        twins = [f for f in self.leaf_futures.get(idx, []) if f in self.pending]
        if twins:
            return                                  # a copy elsewhere may still succeed
        from distributed import KilledWorker

        tried = set(failures)
        bad_anywhere = {w for fs in self.failed_on.values() for w in fs}
        others = [w for w in self._alive_workers() if w not in tried]
        others = [w for w in others if w not in bad_anywhere] or others
        a, b = self.bounds[idx]
        if isinstance(exc, KilledWorker) or len(failures) >= self.attempts or not others:
            if len(failures) > 1 and isinstance(exc, PipelineError):
                where = ", ".join(sorted(failures))
                exc = PipelineError(exc.shard, f"{exc.problem}; it failed on every worker tried ({where}): "
                                    "the pipeline, not a worker, is at fault", count=exc.count)
            raise exc.with_traceback(tb)   # the task's own error, e.g. PipelineError(shard=...)
        self.leaf_futures[idx] = [f for f in self.leaf_futures.get(idx, []) if f is not fut]
        self._submit_leaf(idx, workers=others, retry=len(failures))
        self.outcome.retried.append({"block": [a, b], "failed_on": worker, "error": failures[worker],
                                     "retry_on": others})
        self.events.emit("retry", self.run_id, start=a, stop=b, failed_on=worker, error=failures[worker][:300])

    async def _track(self, fut) -> None:
        """On the client's loop: wake :meth:`_collect` when block ``fut`` ends (once per future).

        Waiting on every pending block at each turn of the driver cost the client a coroutine
        per block in flight per turn; one tracker per submitted block is constant work per block.
        A block that ends, is lost and ends again is seen by the next turn's status check.
        """
        from distributed.client import _wait

        try:
            await _wait([fut])
        except BaseException:        # cancelled, errored, the client closing: all end the wait
            pass
        finally:
            self._wake_event().set()

    def _wake_event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def _first_done(self, futures: list, timeout: float) -> list:
        """The ended ones of ``futures`` (all tracked blocks), waiting up to ``timeout`` for one."""
        ready = [f for f in futures if f.done()]
        if ready:
            return ready
        wake = self._wake_event()
        wake.clear()
        ready = [f for f in futures if f.done()]   # nothing runs on this loop between the two checks
        if not ready:
            try:
                await asyncio.wait_for(wake.wait(), timeout)
            except asyncio.TimeoutError:
                return []
            ready = [f for f in futures if f.done()]
        return ready

    async def _collect(self, futures: list, timeout: float) -> tuple[list, dict]:
        """Wait for the first of ``futures`` to end, then gather every finished one: one hop."""
        from distributed.client import _wait  # distributed.wait() insists on a default client

        futures = self._waitable(futures)
        if not futures:
            await asyncio.sleep(timeout)
            return [], {}
        from distributed.client import FuturesCancelledError

        if all(f.key in self._tracked for f in futures):
            done = await self._first_done(futures, timeout)
            if not done:
                return [], {}
        else:
            try:
                done = (await _wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")).done
            except TimeoutError:
                return [], {}
            except FuturesCancelledError:      # the caller says by whom (see _raise_if_cancelled)
                return [f for f in futures if f.status == "cancelled"], {}
        finished = [f for f in done if f.status == "finished"]
        if not finished:
            return list(done), {}
        # A worker frozen (SIGSTOP) after it finished a task holds the result without answering:
        # gather with a bound, then one by one, and leave what cannot be fetched pending. A
        # result that could not be fetched is tried again later with twice the bound (a large
        # state on a slow network is fetched in the end); meanwhile it is timed, and copied by
        # speculation, like a block still running.
        bound = self._gather_bound()
        try:
            values = await asyncio.wait_for(self.client.gather(finished, asynchronous=True), bound)
            for f in finished:
                self.unfetched.pop(f.key, None)
            return list(done), dict(zip(finished, values))   # done also holds errored and lost futures
        except asyncio.TimeoutError:
            pass
        bounds = [2 * self.unfetched[f.key][1] if f.key in self.unfetched else bound for f in finished]
        got = await asyncio.gather(*(asyncio.wait_for(self.client.gather([f], asynchronous=True), b)
                                     for f, b in zip(finished, bounds)), return_exceptions=True)
        values_by = {f: v[0] for f, v in zip(finished, got) if isinstance(v, list)}
        now = time.monotonic()
        for f, b in zip(finished, bounds):
            if f in values_by:
                self.unfetched.pop(f.key, None)
            else:
                self.unfetched[f.key] = (now, b)
                self.running.setdefault(f.key, (now, "the worker holding its result (not answering)"))
        return [f for f in done if f in values_by or f.status != "finished"], values_by

    def _gather_bound(self) -> float:
        """Seconds a gather of finished results may take before it is retried later."""
        return self.check_limit() or 30.0

    def _waitable(self, futures) -> list:
        """``futures`` less those whose result could not be fetched a moment ago (see _collect)."""
        if not self.unfetched:
            return list(futures)
        now = time.monotonic()
        return [f for f in futures if f.key not in self.unfetched
                or now - self.unfetched[f.key][0] >= self.unfetched[f.key][1]]

    def _cancel_all(self) -> None:
        futs = list(self.pending) + [f for _, f in self.checks.values()]
        futs += [f for attempts in self.check_attempts.values() for f, _, _ in attempts]
        self.pending.clear()
        if futs:
            self.client.cancel(futs)

    def execute(self) -> tuple[Any, Outcome]:
        """Compute, verify and fold; returns the root state and what happened."""
        self.events.emit("start", self.run_id, name=self.job.name, shards=self.job.shards,
                         block=self.block, key_prefix=self.tag, reused=len(self.known),
                         client=getattr(self.client, "id", None))
        todo: deque = deque()
        for idx, (a, b) in enumerate(self.bounds):
            if all(s in self.known for s in range(a, b)):
                st = tree_fold(self.reducer.merge, [self.known[s] for s in range(a, b)])
                self.block_states[idx] = st
                for s in range(a, b):
                    if s in self.candidates:
                        self.kept[s] = self.known[s]
                if self.progress is not None:
                    self.progress.update(b - a)
                self._emit_accepted(a, b, "store", 0, st)
                self._arrive(0, idx, st)
            else:
                todo.append(idx)
        # Blocks that hold the first verification shards go first, so that their checks run
        # alongside the rest of the run instead of after it. The tree fixes the bits, not the order.
        todo = deque(sorted(todo, key=lambda i: not self.early.intersection(range(*self.bounds[i]))))
        try:
            self._drain(todo, lambda: self.root is not None and not self.pending)
            root = self.root
            if self.verify_k:
                root = self._verify(root)
        except BaseException as exc:
            lost = _lost_scheduler(self.client, exc)
            if not lost:                    # with the scheduler gone, Dask has cancelled them all
                self._cancel_all()
            err = self._lost_scheduler_error(exc) if lost else None
            self.events.emit("failed", self.run_id, reason=_one_line(err or exc)[:500],
                             error=type(err or exc).__name__)
            self.events.flush(timeout=1.0)   # a failing run (a scheduler gone?) does not wait on its log
            if err is not None:
                raise err from exc
            raise
        return root, self.outcome           # its events are queued; the caller adds done and flushes

    def _lost_scheduler_error(self, exc: BaseException) -> ResearchError:
        address = getattr(getattr(self.client, "scheduler", None), "address", None) or "the scheduler"
        have = len(self.known) + self.outcome.computed
        missing = self.job.shards - have
        if self.store is not None:
            where = self.store.display(self.store.run_dir(self.run_id))
            kept = (f"the {have:,} of {self.job.shards:,} shards stored in {where} are kept; run the same "
                    f"command again (on a running scheduler) to resume: it computes only the missing {missing:,}")
        else:
            kept = (f"{have:,} of {self.job.shards:,} shards were computed but no store= was given, so they "
                    "are lost; pass store= (--store) to make a run resumable")
        return ResearchError(f"run {self.run_id[:12]} lost the connection to {address} "
                             f"({type(exc).__name__}: {_one_line(exc)[:200]}): {kept}")

    # -- verification -----------------------------------------------------------------------
    def _producers(self) -> dict[int, str]:
        return {int(s): self.worker_names[w] for s, w in enumerate(self.producer) if w >= 0
                and (s in self.kept)}

    def _submit_check(self, s: int, producer: str, exclude: set[str] | frozenset = frozenset()) -> bool:
        """Recompute shard ``s`` on a worker other than its producer (a distinct key).

        ``exclude``: workers already tried for this check. ``False`` if no worker is left.
        """
        if s in self.checks and not exclude:
            return True
        alive = [w for w in (self._responsive_workers() if exclude else self._alive_workers()) if w not in exclude]
        if not alive:
            return False
        others = [w for w in alive if w != producer] or alive
        target = others[len(self.checks) % len(others)]
        attempts = self.check_attempts.setdefault(s, [])
        suffix = f"-m{len(attempts)}" if attempts else ""
        # allow_other_workers: if the target dies the check still runs (the worker that
        # really ran it is recorded, and a same-worker check is marked as such).
        fut = self.client.submit(verify_shard, self.job, self.reducer, s, pure=False,
                                 key=f"mc-verify-{self.tag}-{s}{suffix}", workers=[target], allow_other_workers=True)
        attempts.append((fut, target, time.monotonic()))
        if s in self.checks:
            self.checks[s][0].setdefault("moved_from", []).append(self.checks[s][0]["verifier"])
            self.checks[s][0]["verifier"] = target
            self.checks[s] = (self.checks[s][0], fut)
        else:
            self.checks[s] = ({"shard": s, "producer": producer, "verifier": target}, fut)
        return True

    def _gather_checks(self) -> dict[int, tuple[Any, str]]:
        """Each check's (state, worker that ran it); a check late or failing moves elsewhere.

        A check counts as late when it has not finished ``check_limit()`` seconds after it was
        submitted or after verification began waiting, whichever is later (a check submitted
        early may legitimately wait behind the run's blocks). A late check is submitted again on
        a worker not yet tried; the first attempt to finish wins. With no worker left, the
        client recomputes the shard itself.
        """
        results: dict[int, tuple[Any, str]] = {}
        began = time.monotonic()
        while True:
            open_ = [s for s in self.checks if s not in results]
            if not open_:
                return results
            owner = {f: s for s in open_ for f, _, _ in self.check_attempts[s] if f.status in ("pending", "finished")}
            done, values = self.client.sync(self._collect, list(owner), self.poll) if owner else ([], {})
            self._raise_if_cancelled(done)
            for f, value in values.items():
                s = owner[f]
                if s not in results:
                    results[s] = value
                    self.checks[s][0]["verifier"] = value[1]
                    stale = [g for g, _, _ in self.check_attempts[s] if g is not f]
                    if stale:
                        self.client.cancel(stale)
            now = time.monotonic()
            limit = self.check_limit()
            for s in open_:
                if s in results:
                    continue
                attempts = self.check_attempts[s]
                fut, target, submitted = attempts[-1]
                errored = [g for g, _, _ in attempts if g.status == "error"]
                late = limit is not None and now - max(submitted, began) > limit
                if not late and len(errored) < len(attempts):
                    continue
                tried = {t for _, t, _ in attempts}
                record = self.checks[s][0]
                reason = "failed" if errored and len(errored) == len(attempts) else f"late ({now - max(submitted, began):.1f} s)"
                self.events.emit("check-moved", self.run_id, shard=s, worker=target, reason=reason)
                if not self._submit_check(s, record["producer"], exclude=tried):
                    # Every worker was tried: the client recomputes the shard itself.
                    record.setdefault("moved_from", []).append(record["verifier"])
                    results[s] = (compute_shard(self.job, s, reducer=self.reducer), "client")
                    self.checks[s][0]["verifier"] = "client"
                    self.client.cancel([g for g, _, _ in attempts])

    def _verify(self, root: Any) -> Any:
        producers = self._producers()
        picks = [s for s in choose_shards(self.run_id, self.job.shards, producers, self.verify_k) if s in self.kept]
        picks += [s for s in self.reused_picks if s in self.kept and s not in picks]
        for w, s in self.first_of_worker.items():  # every producer covered, even outside the candidates
            if w not in {producers.get(p) for p in picks}:
                picks.append(s)
        for s in picks:
            self._submit_check(s, producers.get(s, "?"))
        gathered = self._gather_checks()
        checks = [c for c, _ in self.checks.values()]
        results = [gathered[c["shard"]] for c in checks]
        bad: set[str] = set()
        mismatches = []
        for check, (state, where) in zip(checks, results):
            s = check["shard"]
            check["verifier"] = where
            check["same_worker"] = where == check["producer"]
            check["elsewhere"] = not check["same_worker"]
            diff = states_match(self.kept[s], state)
            check["match"] = diff is None
            if diff is None:
                continue
            referee = compute_shard(self.job, s, reducer=self.reducer)   # the client decides
            producer_ok = states_match(self.kept[s], referee) is None
            verifier_ok = states_match(state, referee) is None
            culprit = [w for w, ok in ((check["producer"], producer_ok), (where, verifier_ok)) if not ok]
            bad.update(culprit)
            mismatches.append({"shard": s, "difference": diff, "faulty": culprit})
        elsewhere = sum(1 for c in checks if c["elsewhere"])
        record = {"tolerance": TOLERANCE, "checked": checks, "mismatches": mismatches,
                  "quarantined_workers": sorted(bad), "recomputed_shards": 0,
                  "checks": len(checks), "checks_elsewhere": elsewhere,
                  "elsewhere": f"{elsewhere} of {len(checks)}",
                  "moved": sum(1 for c in checks if c.get("moved_from")),
                  "reused_checked": [int(s) for s in self.reused_picks]}
        for c in checks:
            self.events.emit("check", self.run_id, shard=c["shard"], producer=c["producer"],
                             verifier=c["verifier"], match=c["match"])
        if bad:
            self.events.emit("quarantine", self.run_id, workers=sorted(bad),
                             shards=[int(s) for s in range(self.job.shards)
                                     if self.producer[s] >= 0 and self.worker_names[self.producer[s]] in bad])
        if bad:
            root = self._quarantine(bad, record)
        self.outcome.verification = record
        return root

    def _quarantine(self, bad: set[str], record: dict) -> Any:
        bad_ids = {self.worker_names.index(w) for w in bad if w in self.worker_names}
        good = [w for w in self._alive_workers() if w not in bad]
        if not good:
            raise VerificationError(self.run_id, f"workers {sorted(bad)} produced shards that others "
                                    "cannot reproduce, and no other worker is left to recompute them")
        redo = [idx for idx, (a, b) in enumerate(self.bounds)
                if any(self.producer[s] in bad_ids for s in range(a, b))]
        if self.store is not None:
            for path in {f for s, (_, w, f) in self._stored_files().items() if w in bad}:
                self.store.quarantine(self.run_id, path, f"produced by {sorted(bad)}; failed verification")
        for idx in redo:
            a, b = self.bounds[idx]
            for s in range(a, b):
                if self.producer[s] in bad_ids:
                    self.known.pop(s, None)
            self.block_states.pop(idx, None)
        self.nodes.clear()
        self.tree_enabled, self.progress = False, None
        before = self.outcome.computed
        # Recompute on good workers only; fold everything again on the client (same tree).
        for idx in redo:
            self._submit_leaf(idx, workers=good)
        self._drain(deque(), lambda: all(i in self.block_states for i in redo) and not self.pending)
        self._cancel_all()
        record["recomputed_shards"] = self.outcome.computed - before
        return tree_fold(self.reducer.merge, [self.block_states[i] for i in range(len(self.bounds))])

    def _stored_files(self) -> dict:
        if self.store is None or not self.store.has_run(self.run_id):
            return {}
        return self.store.read_shards(self.run_id, decoder=lambda doc: None)

