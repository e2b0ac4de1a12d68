"""The execution loop of a run: windowed blocks, the fixed tree folded as blocks arrive, checks.

Blocks of shards are submitted at most ``window`` at a time (the client and scheduler never
hold a future per shard), blocks holding the first verification shards first, so their checks
overlap the run; the blocks a driver turn submits go to Dask as one graph
(:mod:`.submission`), in groups whose results reach the client in one message per group
(:mod:`.groups`). When a block finishes, the driver gathers its result (:mod:`.arrivals`:
the block's folded state, and the few shard states verification keeps; where the store is
reachable from the workers the block task has written its shard file itself and sends the
file's checksum, else every shard's state comes back and the driver writes it, see
:mod:`.blocks`), and folds the fixed tree (:mod:`.folding`): the root exists the moment the
last block arrives. The driver holds these states anyway, so a merge costs it a few
microseconds where a merge task would cost a scheduler round trip. Near the end, a block
running far longer than the median is duplicated on another worker (:mod:`.stragglers`); the
first finisher wins (shards are deterministic, so either is right). Before the result is
accepted, shards are recomputed on other workers and compared (:mod:`.checks`); a mismatch
quarantines the faulty worker's shards (or a faulty stored file), which are recomputed
elsewhere. Events go to the scheduler's log through an ordered outbox, off the driver's path.

Nothing waits without a bound (:mod:`.timing`): a block running longer than
``research.montecarlo.block-timeout`` fails the run with a :class:`PipelineError` naming its
shards, worker and elapsed time; a check that does not finish within
``research.montecarlo.check-timeout`` moves to another worker; a block that fails on one worker
is tried on another (up to ``research.montecarlo.pipeline-attempts`` workers); a lost scheduler
becomes a :class:`ResearchError` saying what is stored and that the same command resumes
(:mod:`.failures`). A failing run logs a ``failed`` event with its reason.
"""
from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .. import config
from ..exceptions import ConfigError, PipelineError, VerificationError
from .accumulators import Moments
from .arrivals import Arrivals
from .blocks import compute_and_store_block, store_target
from .checks import Checks, Producers, alive_workers
from .events import EventOutbox, RunningEstimate
from .failures import lost_scheduler, lost_scheduler_error, one_line, raise_if_cancelled
from .folding import TreeFolder
from .groups import Groups, chunks, collect_group
from .keys import block_key, group_key
from .shard import BlockResult, compute_block
from .stragglers import Stragglers
from .submission import submit_many
from .timing import Limits
from .tree import block_bounds, tree_fold
from .verify import choose_reused, hash_order, reused_count

__all__ = ["Execution", "Outcome"]


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


class _Waited:
    """What a driver turn waits on: the blocks' own futures, and the groups' collectors."""

    def __init__(self, pending: dict, groups: Groups):
        self.pending, self.groups = pending, groups

    def __contains__(self, fut: Any) -> bool:
        return fut in self.pending or fut in self.groups


class Execution:
    """One run of a job on a client. Use :meth:`execute`."""

    def __init__(self, client, job, reducer, block: int, *, run_id: str, known=None,
                 known_producers=None, store=None, verify: int = 0, window: int = 64,
                 speculate: float = 0.0, progress=None, poll: float = 0.2,
                 shard_seconds: float | None = None, store_token: str | None = None):
        self.client, self.job, self.reducer, self.block = client, job, reducer, block
        self.run_id, self.store, self.verify_k = run_id, store, int(verify)
        self.window, self.poll = max(1, int(window)), poll
        self.progress = progress
        self.known: dict[int, Any] = dict(known or {})
        self.reused = set(self.known)                   # shards reused from the store
        self.tag = f"{run_id[:12]}-{uuid.uuid4().hex[:6]}"
        self.bounds = block_bounds(job.shards, block)
        self.producers = Producers(job.shards, known_producers)
        self.block_states: dict[int, Any] = {}
        self.tree: TreeFolder | None = TreeFolder(len(self.bounds), reducer.merge)  # None after a quarantine
        self.pending: dict[Any, int] = {}            # block future -> block index
        self.leaf_futures: dict[int, list] = {}
        self.spec_keys: set[str] = set()             # keys of speculative copies
        self.quarantined: set[str] = set()           # workers that failed verification: never given work again
        self.outcome = Outcome(reused=len(self.known))
        # States kept for verification: the hashed candidates, and each worker's first shard.
        self.candidates = set(hash_order(run_id, job.shards, self.verify_k + 64)) if self.verify_k else set()
        self.kept: dict[int, Any] = {s: st for s, st in self.known.items() if s in self.candidates}
        # Shards reused from a store are also checked, drawn unpredictably: the hashed picks are
        # public, so a store's editor would otherwise know which shards nobody recomputes.
        n_reused = reused_count(config.resolve("montecarlo.verify-reused"), self.verify_k, len(self.known)) \
            if self.verify_k else 0
        self.reused_picks = choose_reused(self.known, n_reused)
        self.kept.update({s: self.known[s] for s in self.reused_picks})
        self.first_of_worker: dict[str, int] = {}
        # The first k hashed shards are checked as soon as they exist, overlapping the run.
        self.early = set(hash_order(run_id, job.shards, self.verify_k)) if self.verify_k else set()
        self.estimate = RunningEstimate()
        self.events = EventOutbox(client)
        # Time limits: the pilot's seconds per shard (if the caller passes them) and what blocks take.
        self.limits = Limits(block, shard_seconds)
        self.attempts = int(config.resolve("montecarlo.pipeline-attempts"))
        if self.attempts < 1:
            raise ConfigError("montecarlo.pipeline-attempts", self.attempts, "a positive number of workers")
        self.stragglers = Stragglers(client, self.limits, speculate=float(speculate or 0.0), poll=poll,
                                     bounds=self.bounds, emit=self._emit)
        self.arrivals = Arrivals(client, bound=self.limits.gather_bound, on_unfetched=self._unanswered)
        self.checks = Checks(client, job, reducer, run_id=run_id, tag=self.tag, emit=self._emit,
                             limits=self.limits, poll=poll)
        self.failed_on: dict[int, dict[str, str]] = {}   # block -> worker -> its error
        size = config.resolve("montecarlo.group-blocks")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError("montecarlo.group-blocks", size, "a positive number of blocks (1: no groups)")
        # At most half the window per group, so that half the window stays in flight while a
        # group's results travel and the next group is submitted: the workers never run dry.
        self.groups = Groups(min(size, max(1, self.window // 2)))
        # A run of fewer than 4 windows of blocks forms no groups: it saves milliseconds there, and
        # the transfers to a collector's worker leave worker-to-worker connections that make a
        # LocalCluster closed right after the run race its own shutdown (Dask logs a closed comm).
        self._may_group = self.groups.size > 1 and len(self.bounds) >= 4 * self.window
        self._waited = _Waited(self.pending, self.groups)
        self._groups_checked: float | None = None      # when overdue groups were last looked for (None: never)
        # Who writes the shard files: the block tasks when the store is reachable from the
        # workers (each block checks, see .blocks), else the client. The run's lease token is
        # the workers' probe: without one (no lease held) the client writes.
        writes = config.resolve("montecarlo.store-writes")
        if writes not in ("auto", "client"):
            raise ConfigError("montecarlo.store-writes", writes, '"auto" (the workers write when they can '
                              'reach the store) or "client"')
        self.target = store_target(store, run_id, store_token) if writes == "auto" else None
        if store is not None:
            reason = None if self.target is not None else (
                "research.montecarlo.store-writes is client" if writes == "client" else "no lease held on the store")
            self.outcome.store_writes = {"setting": writes, "blocks_by_workers": 0, "blocks_by_client": 0,
                                         "client_reason": reason}

    def _emit(self, kind: str, **data: Any) -> None:
        self.events.emit(kind, self.run_id, **data)

    # -- the run ----------------------------------------------------------------------------
    def execute(self) -> tuple[Any, Outcome]:
        """Compute, verify and fold; returns the root state and what happened."""
        self._emit("start", name=self.job.name, shards=self.job.shards, block=self.block, key_prefix=self.tag,
                   reused=len(self.known), client=getattr(self.client, "id", None))
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
                self._fold(idx, st)
            else:
                todo.append(idx)
        # Blocks that hold the first verification shards go first, so that their checks run
        # alongside the rest of the run instead of after it. The tree fixes the bits, not the order.
        todo = deque(sorted(todo, key=lambda i: not self.early.intersection(range(*self.bounds[i]))))
        try:
            self._drain(todo, lambda: self.root is not None and not self.pending)
            self.outcome.groups = {"size": self.groups.size, "formed": self.groups.formed,
                                   "opened": self.groups.opened}
            root = self.root
            if self.verify_k:
                root = self._verify(root)
        except BaseException as exc:
            lost = lost_scheduler(self.client, exc)
            if not lost:                    # with the scheduler gone, Dask has cancelled them all
                self._cancel_all()
            err = self._lost_scheduler_error(exc) if lost else None
            self._emit("failed", reason=one_line(err or exc)[:500], error=type(err or exc).__name__)
            self.events.flush(timeout=1.0)   # a failing run (a scheduler gone?) does not wait on its log
            if err is not None:
                raise err from exc
            raise
        return root, self.outcome           # its events are queued; the caller adds done and flushes

    @property
    def root(self) -> Any:
        """The folded root, once every block has arrived (``None`` before)."""
        return self.tree.root if self.tree is not None else None

    def _fold(self, idx: int, state: Any) -> None:
        if self.tree is not None:
            self.tree.arrive(idx, state)

    def _lost_scheduler_error(self, exc: BaseException):
        address = getattr(getattr(self.client, "scheduler", None), "address", None)
        where = self.store.display(self.store.run_dir(self.run_id)) if self.store is not None else None
        return lost_scheduler_error(exc, address=address, run_id=self.run_id, shards=self.job.shards,
                                    have=len(self.known) + self.outcome.computed, where=where)

    def _cancel_all(self) -> None:
        futs = list(self.pending) + self.checks.futures() + list(self.groups.live)
        self.pending.clear()
        self.groups.live.clear()
        if futs:
            self.client.cancel(futs)

    # -- the driver's loop ------------------------------------------------------------------
    def _drain(self, todo: deque, until) -> None:
        while not until():
            # Refill once a group's worth of the window is free; any free slot when no group is in
            # flight (nothing would free a group's worth at once: blocks stuck one by one on a
            # frozen worker must not starve the run) or when the rest fits.
            free = self.window - len(self.pending)
            if todo and free > 0 and (free >= self.groups.size or not self.groups or len(todo) <= free):
                self._submit_leaves([todo.popleft() for _ in range(min(free, len(todo)))])
            if until():
                break
            if not self.pending:
                raise RuntimeError("internal error: nothing pending but the run is not finished")
            done, values = self.client.sync(self._collect, self._waited, self.poll)
            cancelled = [f for f in done if f in self.pending and f.status == "cancelled"]
            if cancelled:
                raise_if_cancelled(self.client, self.run_id, cancelled)
            # Only what was gathered is accepted. A future that finished and then lost its data
            # with its worker ("lost": Dask recomputes it) stays pending; one whose speculative
            # twin was accepted a moment ago in this same loop is no longer pending.
            for f, res in values.items():
                if f in self.groups:
                    for member, r in zip(self.groups.take(f), res):
                        if member in self.pending:
                            self._leaf_done(self.pending.pop(member), member, r)
                elif f in self.pending:
                    self._leaf_done(self.pending.pop(f), f, res)
            for f in done:
                if f in self.groups:            # no result (a block failed, was cancelled...): open it
                    self._open_group(f)
                elif f in self.pending and f.status == "error":
                    self._leaf_failed(self.pending.pop(f), f)
            self._maybe_speculate(todo)

    async def _collect(self, wanted: Any, timeout: float) -> tuple[list, dict]:
        """The one wait of a driver turn, on the client's loop (see :meth:`.Arrivals.collect`)."""
        return await self.arrivals.collect(wanted, timeout)

    # -- blocks -----------------------------------------------------------------------------
    def _submit_leaves(self, idxs: list[int], workers=None, speculative: bool = False, retry: int = 0) -> None:
        """Submit blocks ``idxs`` as one graph (restricted to ``workers`` if given)."""
        # Distinct keys for duplicates and recomputations: Dask would hand back a cached value.
        writes_or_none = self.target is not None or self.store is None
        argsets: list[tuple] = []
        keys: list[str] = []
        for idx in idxs:
            a, b = self.bounds[idx]
            known = {s: self.known[s] for s in range(a, b) if s in self.known} if self.known else {}
            keys.append(block_key(self.tag, a, b, speculative=speculative, tree=self.tree is not None,
                                  retry=retry))
            if writes_or_none:
                # The block's task writes the store, or there is none: only the states the client
                # keeps for verification come back with the block's root (see .blocks).
                keep = tuple(sorted(s for s in self.candidates if a <= s < b))
                argsets.append((self.job, self.reducer, a, b, known, self.target, keep))
            else:
                argsets.append((self.job, self.reducer, a, b, known))
        if writes_or_none:
            futs = submit_many(self.client, compute_and_store_block, argsets, keys, workers, trim=self.store is None)
        else:
            futs = submit_many(self.client, compute_block, argsets, keys, workers)
        for idx, fut in zip(idxs, futs):
            self.pending[fut] = idx
            self.leaf_futures.setdefault(idx, []).append(fut)
            if speculative:
                self.spec_keys.add(fut.key)
        # Groups only where they save something (see .groups): not in a small run, nor for copies,
        # retries or recomputations on chosen workers, nor when every shard state comes back.
        grouped = (self._may_group and writes_or_none and len(futs) > 1 and not speculative
                   and not retry and workers is None)
        parts = chunks(futs, self.groups.size) if grouped else [[f] for f in futs]
        self.arrivals.track([part[0] for part in parts if len(part) == 1] + self._submit_groups(
            [part for part in parts if len(part) > 1]))
        self.outcome.max_in_flight = max(self.outcome.max_in_flight, len(self.pending))

    def _submit_groups(self, parts: list[list]) -> list:
        """One collector task per part (one graph for all of them); the collectors' futures."""
        if not parts:
            return []
        keys = [group_key(self.tag, self.bounds[self.pending[p[0]]][0], self.bounds[self.pending[p[-1]]][1])
                for p in parts]
        # Ahead of any block not started yet: a group's results leave as soon as its last block ends.
        collectors = submit_many(self.client, collect_group, [(p,) for p in parts], keys, priority=1)
        for collector, part in zip(collectors, parts):
            self.groups.add(collector, part)
        return collectors

    def _open_group(self, collector) -> None:
        """Wait on ``collector``'s blocks one by one from now on (see :mod:`.groups`)."""
        self.arrivals.track([m for m in self.groups.open(collector) if m in self.pending])

    def _leaf_done(self, idx: int, fut, res: BlockResult) -> None:
        if idx in self.block_states:
            return  # a speculative twin already won
        for other in self.leaf_futures.pop(idx, []):
            self.stragglers.running.pop(other.key, None)
            if other is not fut:
                self.pending.pop(other, None)
                other.cancel()
                self.outcome.speculated.append({"block": list(self.bounds[idx]), "winner": res.worker,
                                                "speculative_won": fut.key in self.spec_keys})
        if res.computed and self.store is not None:
            self._record_store(res)
        self.producers.record(res.computed, res.worker)
        states = res.shard_states    # a block that wrote the store returns only the few kept here
        small, large = (states, self.candidates) if len(states) < len(self.candidates) else (self.candidates, states)
        for s in [s for s in small if s in large]:
            if s not in self.known:    # computed by this task (a known shard's state is the stored one)
                self.kept[s] = states[s]
        for s in self.early.intersection(res.computed):
            self.checks.submit(s, res.worker)
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
            self.stragglers.durations.append(res.seconds)
            self.limits.shard_times.append(res.seconds / len(res.computed))
        self._emit_accepted(res.start, res.stop, res.worker, len(res.computed), res.state)
        if self.progress is not None:
            self.progress.update(res.stop - res.start)
        self._fold(idx, res.state)

    def _record_store(self, res: BlockResult) -> None:
        """The block's computed shards are in the store: written by its task, or now by the client."""
        rec = self.outcome.store_writes
        assert rec is not None and self.store is not None
        if res.stored is not None:
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
        self._emit("accepted", **data)

    def _encoder(self):
        from .codec import encode

        return getattr(self.reducer, "encode", encode)

    def _leaf_failed(self, idx: int, fut) -> None:
        """A block's task raised: try it on a worker it has not failed on, or fail the run."""
        exc, tb = fut.exception(), fut.traceback()
        seen = self.stragglers.running.pop(fut.key, None)
        worker = getattr(exc, "worker", None) or (seen[1] if seen else "an unknown worker")
        failures = self.failed_on.setdefault(idx, {})
        failures[worker] = one_line(exc)
        twins = [f for f in self.leaf_futures.get(idx, []) if f in self.pending]
        if twins:
            return                                  # a copy elsewhere may still succeed
        from distributed import KilledWorker

        tried = set(failures)
        bad_anywhere = {w for fs in self.failed_on.values() for w in fs}
        others = [w for w in alive_workers(self.client) if w not in tried and w not in self.quarantined]
        others = [w for w in others if w not in bad_anywhere] or others
        a, b = self.bounds[idx]
        if isinstance(exc, KilledWorker) or len(failures) >= self.attempts or not others:
            if len(failures) > 1 and isinstance(exc, PipelineError):
                where = ", ".join(sorted(failures))
                exc = PipelineError(exc.shard, f"{exc.problem}; it failed on every worker tried ({where}): "
                                    "the pipeline, not a worker, is at fault", count=exc.count)
            raise exc.with_traceback(tb)   # the task's own error, e.g. PipelineError(shard=...)
        self.leaf_futures[idx] = [f for f in self.leaf_futures.get(idx, []) if f is not fut]
        self._submit_leaves([idx], workers=others, retry=len(failures))
        self.outcome.retried.append({"block": [a, b], "failed_on": worker, "error": failures[worker],
                                     "retry_on": others})
        self._emit("retry", start=a, stop=b, failed_on=worker, error=failures[worker][:300])

    def _maybe_speculate(self, todo: deque) -> None:
        """After every wait: fail the run on a hung block, copy a straggler near the end (see :mod:`.stragglers`).

        Both look at every block in flight, so both run only when the scheduler's view of what
        runs where was read (at most once a second, near the end once per ``poll``): a turn of
        the driver costs what ended, not what is in flight.
        """
        now = time.monotonic()
        ending = not todo
        if self.groups and (self._groups_checked is None or now - self._groups_checked >= 1.0):
            self._groups_checked = now
            # A group late after one of its blocks finished: the blocks answer one by one.
            per_shard = self.limits.expected_shard_seconds()
            block = self.stragglers.durations.median() or (per_shard * self.block if per_shard else 1.0)
            for collector in self.groups.overdue(now, 1.0 + (self.groups.size + 2) * block):
                self._open_group(collector)
        processing = self.stragglers.watch(now, self.pending, ending=ending)
        if processing is not None:       # what runs where was read now: time the blocks in flight
            self.stragglers.check_hung(now, self.pending, self.leaf_futures, self._out)
        self.stragglers.speculate_copies(now, processing, ending, self.block_states, self.leaf_futures, self._copy,
                                         self._out)

    def _unanswered(self, key: str, now: float) -> None:
        holders = self.arrivals.holders.get(key) or []
        self.stragglers.unanswered(key, now, holders[0] if len(holders) == 1 else None)

    def _out(self, fut) -> bool:
        """Whether ``fut`` has not returned: running, waiting, or finished with a result not fetched."""
        return fut.status != "finished" or fut.key in self.arrivals.unfetched

    def _copy(self, idx: int, slow_worker: str) -> None:
        """A speculative copy of block ``idx``, on any worker but ``slow_worker``, and never on one
        holding results that cannot be fetched (frozen, most likely) while another is left."""
        alive = [w for w in alive_workers(self.client) if w not in self.quarantined]
        others = [w for w in alive if w != slow_worker]
        suspects = self.arrivals.suspects()
        if suspects:    # a result that cannot be fetched says more than where the block was seen
            answering = [w for w in alive if w not in suspects]
            others = [w for w in answering if w != slow_worker] or answering or others
        if others:
            self._submit_leaves([idx], workers=others, speculative=True)
            a, b = self.bounds[idx]
            self._emit("speculate", start=a, stop=b, slow_worker=slow_worker)

    # -- verification -----------------------------------------------------------------------
    def _verify(self, root: Any) -> Any:
        record, bad, bad_stored = self.checks.verify(self.kept, self.producers, self.first_of_worker,
                                                     self.reused_picks, self.verify_k, self.reused)
        if bad or bad_stored:
            root = self._quarantine(bad, bad_stored, record)
        self.outcome.verification = record
        return root

    def _quarantine(self, bad: set[str], bad_stored: set[int], record: dict) -> Any:
        """Recompute, on good workers, what ``bad`` workers produced and the stored files holding ``bad_stored``."""
        dropped = set(self.producers.shards_of(bad))
        stored = self._stored_files()
        edited = {f for s, (_, _, f) in stored.items() if s in bad_stored}
        dropped |= bad_stored | {s for s, (_, _, f) in stored.items() if f in edited}
        self._emit("quarantine", workers=sorted(bad), shards=sorted(dropped))
        self.quarantined |= bad          # the recomputation's copies and retries never go back to them
        good = [w for w in alive_workers(self.client) if w not in bad]
        if not good:
            raise VerificationError(self.run_id, f"workers {sorted(bad)} produced shards that others "
                                    "cannot reproduce, and no other worker is left to recompute them")
        if self.store is not None:
            files = {f for s, (_, w, f) in stored.items() if w in bad}
            for path in files:
                self.store.quarantine(self.run_id, path, f"produced by {sorted(bad)}; failed verification")
            for path in edited - files:
                self.store.quarantine(self.run_id, path, "holds a shard that differs from its recomputation; "
                                      "failed verification")
            if edited:
                record["quarantined_files"] = sorted(self.store.display(f) for f in edited)
        redo = [idx for idx, (a, b) in enumerate(self.bounds) if any(s in dropped for s in range(a, b))]
        for idx in redo:
            for s in range(*self.bounds[idx]):
                if s in dropped:
                    self.known.pop(s, None)
            self.block_states.pop(idx, None)
        self.tree, self.progress = None, None
        before = self.outcome.computed
        # Recompute on good workers only; fold everything again on the client (same tree).
        self._submit_leaves(redo, workers=good)
        self._drain(deque(), lambda: all(i in self.block_states for i in redo) and not self.pending)
        self._cancel_all()
        record["recomputed_shards"] = self.outcome.computed - before
        return tree_fold(self.reducer.merge, [self.block_states[i] for i in range(len(self.bounds))])

    def _stored_files(self) -> dict:
        if self.store is None or not self.store.has_run(self.run_id):
            return {}
        return self.store.read_shards(self.run_id, decoder=lambda doc: None)
