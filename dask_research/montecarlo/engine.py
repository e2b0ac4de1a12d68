"""The execution loop of a run: windowed blocks, the fixed tree folded as blocks arrive, checks.

Blocks of shards are submitted at most ``window`` at a time (the client and scheduler never
hold a future per shard), blocks holding the first verification shards first, so their checks
overlap the run. When a block finishes, the driver gathers its result (the block's folded
state and each shard's own state, which the store persists and verification keeps), and folds
the fixed tree: every merge whose two children exist is done at once, so the root exists the
moment the last block arrives. The driver holds these states anyway, so a merge costs it a few
microseconds where a merge task would cost a scheduler round trip (and, for the last levels, a
chain of them after the last block). Near the end, a block running far longer than the median
is duplicated on another worker; the first finisher wins (shards are deterministic, so either
is right). Before the result is accepted, shards are recomputed on other workers and compared;
a mismatch quarantines the faulty worker's shards, which are recomputed elsewhere. Events go
to the scheduler's log through an ordered outbox, off the driver's path.
"""
from __future__ import annotations

import statistics
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._cluster import workers_info
from ..exceptions import VerificationError
from .accumulators import Moments
from .events import EventOutbox, RunningEstimate
from .shard import BlockResult, compute_block, compute_shard
from .tree import block_bounds, tree_fold
from .verify import TOLERANCE, choose_shards, hash_order, states_match

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


class Execution:
    """One run of a job on a client. Use :meth:`execute`."""

    def __init__(self, client, job, reducer, block: int, *, run_id: str, known=None,
                 known_producers=None, store=None, verify: int = 0, window: int = 64,
                 speculate: float = 0.0, progress=None, poll: float = 0.2):
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
        self.first_of_worker: dict[str, int] = {}
        # The first k hashed shards are checked as soon as they exist, overlapping the run.
        self.early = set(hash_order(run_id, job.shards, self.verify_k)) if self.verify_k else set()
        self.checks: dict[int, tuple[dict, Any]] = {}
        self.estimate = RunningEstimate()
        self.events = EventOutbox(client)
        self._threads: tuple[float, int] | None = None   # (when read, threads in the pool)

    # -- bookkeeping ------------------------------------------------------------------------
    def _wid(self, worker: str) -> int:
        if worker not in self.worker_names:
            self.worker_names.append(worker)
        return self.worker_names.index(worker)

    def _alive_workers(self) -> list[str]:
        return sorted(workers_info(self.client))

    def _pool_threads(self) -> int:
        """Threads in the pool, read from the scheduler at most once per ``poll`` seconds."""
        now = time.monotonic()
        if self._threads is None or now - self._threads[0] > self.poll:
            self._threads = (now, sum(self.client.nthreads().values()))
        return self._threads[1]

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
    def _submit_leaf(self, idx: int, workers=None, speculative: bool = False) -> None:
        a, b = self.bounds[idx]
        known = {s: self.known[s] for s in range(a, b) if s in self.known}
        # Distinct keys for duplicates and recomputations: Dask would hand back a cached value.
        prefix = "mc-spec" if speculative else ("mc-redo" if not self.tree_enabled else "mc-block")
        kw = {"workers": workers, "allow_other_workers": False} if workers else {}
        fut = self.client.submit(compute_block, self.job, self.reducer, a, b, known,
                                 key=f"{prefix}-{self.tag}-{a}-{b}", pure=False, **kw)
        self.pending[fut] = idx
        self.outcome.max_in_flight = max(self.outcome.max_in_flight, len(self.pending))
        self.leaf_futures.setdefault(idx, []).append(fut)

    def _leaf_done(self, idx: int, fut, res: BlockResult) -> None:
        if idx in self.block_states:
            return  # a speculative twin already won
        for other in self.leaf_futures.pop(idx, []):
            if other is not fut:
                self.pending.pop(other, None)
                other.cancel()
                self.outcome.speculated.append({"block": list(self.bounds[idx]), "winner": res.worker,
                                                "speculative_won": fut.key.startswith("mc-spec")})
        computed = {s: res.shard_states[s] for s in res.computed}
        if computed and self.store is not None:
            self.store.write_shards(self.run_id, computed, res.worker, encoder=self._encoder())
        wid = self._wid(res.worker)
        for s in res.computed:
            self.producer[s] = wid
            if s in self.candidates:
                self.kept[s] = res.shard_states[s]
        for s in self.early.intersection(res.computed):
            self._submit_check(s, res.worker)
        if res.computed and res.worker not in self.first_of_worker:
            s0 = res.computed[0]
            self.first_of_worker[res.worker] = s0
            self.kept[s0] = res.shard_states[s0]
        for s in range(*self.bounds[idx]):
            if s in self.known and s in self.candidates:
                self.kept.setdefault(s, self.known[s])
        self.outcome.computed += len(res.computed)
        self.outcome.workers[res.worker] = self.outcome.workers.get(res.worker, 0) + len(res.computed)
        self.block_states[idx] = res.state
        if res.computed:
            self.durations.append(res.seconds)
        self._emit_accepted(res.start, res.stop, res.worker, len(res.computed), res.state)
        if self.progress is not None:
            self.progress.update(res.stop - res.start)
        if self.tree_enabled:
            self._arrive(0, idx, res.state)

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
        if self.speculate <= 0 or todo or len(self.durations) < 2:
            return
        unfinished = [i for i in self.leaf_futures if i not in self.block_states]
        if not unfinished or len(unfinished) > self._pool_threads():
            return
        now = time.monotonic()
        limit = self.speculate * statistics.median(self.durations)
        processing = None
        for idx in unfinished:
            self.end_seen.setdefault(idx, now)
            if len(self.leaf_futures[idx]) > 1 or now - self.end_seen[idx] < limit:
                continue
            if processing is None:
                processing = {k: w for w, keys in self.client.processing().items() for k in keys}
            where = processing.get(self.leaf_futures[idx][0].key)
            others = [w for w in self._alive_workers() if w != where]
            if where is not None and others:
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
            errored = [f for f in done if f in self.pending and f.status == "error"]
            if errored:
                exc, tb = errored[0].exception(), errored[0].traceback()
                self._cancel_all()
                raise exc.with_traceback(tb)  # the task's own error, e.g. PipelineError(shard=...)
            # Only what was gathered is accepted. A future that finished and then lost its data
            # with its worker ("lost": Dask recomputes it) stays pending; one whose speculative
            # twin was accepted a moment ago in this same loop is no longer pending.
            for f, res in values.items():
                if f in self.pending:
                    self._leaf_done(self.pending.pop(f), f, res)
            self._maybe_speculate(todo)

    async def _collect(self, futures: list, timeout: float) -> tuple[list, dict]:
        """Wait for the first of ``futures`` to end, then gather every finished one: one hop."""
        from distributed.client import _wait   # distributed.wait() insists on a default client

        try:
            done = (await _wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")).done
        except TimeoutError:
            return [], {}
        finished = [f for f in done if f.status == "finished"]
        values = await self.client.gather(finished, asynchronous=True) if finished else []
        return list(done), dict(zip(finished, values))   # done also holds errored and lost futures

    def _cancel_all(self) -> None:
        futs = list(self.pending) + [f for _, f in self.checks.values()]
        self.pending.clear()
        if futs:
            self.client.cancel(futs)

    def execute(self) -> tuple[Any, Outcome]:
        """Compute, verify and fold; returns the root state and what happened."""
        self.events.emit("start", self.run_id, name=self.job.name, shards=self.job.shards,
                         block=self.block, key_prefix=self.tag, reused=len(self.known))
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
        except BaseException:
            self._cancel_all()
            self.events.flush(timeout=1.0)   # a failing run (a scheduler gone?) does not wait on its log
            raise
        return root, self.outcome           # its events are queued; the caller adds done and flushes

    # -- verification -----------------------------------------------------------------------
    def _producers(self) -> dict[int, str]:
        return {int(s): self.worker_names[w] for s, w in enumerate(self.producer) if w >= 0
                and (s in self.kept)}

    def _submit_check(self, s: int, producer: str) -> None:
        """Recompute shard ``s`` on a worker other than its producer (a distinct key)."""
        if s in self.checks:
            return
        alive = self._alive_workers()
        others = [w for w in alive if w != producer] or alive
        target = others[len(self.checks) % len(others)]
        # allow_other_workers: if the target dies the check still runs (the worker that
        # really ran it is recorded, and a same-worker check is marked as such).
        fut = self.client.submit(verify_shard, self.job, self.reducer, s, pure=False,
                                 key=f"mc-verify-{self.tag}-{s}", workers=[target], allow_other_workers=True)
        self.checks[s] = ({"shard": s, "producer": producer, "verifier": target}, fut)

    def _verify(self, root: Any) -> Any:
        producers = self._producers()
        picks = [s for s in choose_shards(self.run_id, self.job.shards, producers, self.verify_k) if s in self.kept]
        for w, s in self.first_of_worker.items():  # every producer covered, even outside the candidates
            if w not in {producers.get(p) for p in picks}:
                picks.append(s)
        for s in picks:
            self._submit_check(s, producers.get(s, "?"))
        checks = [c for c, _ in self.checks.values()]
        results = self.client.gather([f for _, f in self.checks.values()])
        bad: set[str] = set()
        mismatches = []
        for check, (state, where) in zip(checks, results):
            s = check["shard"]
            check["verifier"] = where
            check["same_worker"] = where == check["producer"]
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
        record = {"tolerance": TOLERANCE, "checked": checks, "mismatches": mismatches,
                  "quarantined_workers": sorted(bad), "recomputed_shards": 0}
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

