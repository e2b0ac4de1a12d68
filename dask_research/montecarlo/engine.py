"""The execution of a run: the driver's loop over its parts, a failed check, a run that fails.

A run's blocks are computed by the driver's turns. Each turn refills the window
(:mod:`.submission`: what to submit next, at most ``window`` blocks in flight, in groups whose
results reach the client in one message), waits once for the first block to end and gathers
every finished one (:mod:`.arrivals`), accepts what came (:mod:`.acceptance`: the block's
folded state and the few shard states verification keeps, the fixed tree folded as blocks
arrive; where the store is reachable from the workers the block task has written its shard file
itself, see :mod:`.blocks`), and then looks at what did not come as it should
(:mod:`.block_watch`: a block that failed is tried on another worker, a hung one fails the run,
a straggler near the end is copied). Blocks holding the first verification shards go first, and
their checks are submitted as soon as no block waits for a thread (the run's last blocks are
all running): the checks then fill the threads those blocks leave idle, instead of running
ahead of blocks the scheduler still queues and pushing the run's end back by their time. On a
one-worker cluster, where no check can run elsewhere, they ride in the last blocks instead
(:meth:`.Verification.assign_riders`). Before
the result is accepted, shards are recomputed on other workers and compared
(:mod:`.verification`); a mismatch quarantines the faulty worker's shards (or a faulty stored
file), which are recomputed elsewhere and folded again. Events go to the scheduler's log
through an ordered outbox, off the driver's path.

Nothing waits without a bound (:mod:`.timing`): a block running longer than
``research.montecarlo.block-timeout`` fails the run with a :class:`PipelineError` naming its
shards, worker and elapsed time; a check that does not finish within
``research.montecarlo.check-timeout`` moves to another worker; a block that fails on one worker
is tried on another (up to ``research.montecarlo.pipeline-attempts`` workers); a lost scheduler
becomes a :class:`ResearchError` saying what is stored and that the same command resumes
(:mod:`.failures`). A failing run logs a ``failed`` event with its reason. Every setting comes
from the run's :class:`~.run_settings.RunSettings`, passed whole.

Examples
--------
>>> from distributed import Client, LocalCluster
>>> from dask_research.montecarlo import Job, Normal, compute_shard
>>> from dask_research.montecarlo.tree import tree_fold
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=8, samples_per_shard=64, seed=1, range=(-8, 8))
>>> reducer = job.make_reducer(job.range)
>>> with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \\
...         Client(cluster, set_as_default=False) as client:
...     state, outcome = Execution(client, job, reducer, 2, settings=RunSettings.parse(verify=1)).execute()
>>> state == tree_fold(reducer.merge, [compute_shard(job, s, reducer=reducer) for s in range(8)])
True
>>> outcome.computed, outcome.verification["mismatches"]
(8, [])
"""
from __future__ import annotations

import contextlib
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from ..exceptions import VerificationError
from .acceptance import Acceptance
from .arrivals import Arrivals
from .block_watch import BlockWatch
from .checks import alive_workers
from .failures import lost_scheduler, lost_scheduler_error, one_line, raise_if_cancelled
from .outcome import Outcome, store_writes_start
from .run_events import EventOutbox
from .run_settings import RunSettings
from .store.held_run import HeldRun
from .store.holdings import Holdings
from .submission import Window
from .timing import Limits
from .tree import block_bounds, tree_fold
from .verification import Verification

__all__ = ["Execution", "Outcome"]

#: Seconds one wait of the driver lasts at most (it then looks at what is in flight).
POLL = 0.2
#: Blocks in flight of an execution whose settings leave the window to the cluster (a run
#: fills it in for its cluster first: :meth:`RunSettings.for_cluster`).
WINDOW = 64


class Execution:
    """One run of ``job`` on ``client``, ``block`` shards per task. Use :meth:`execute`.

    ``settings``: the run's (default: :meth:`RunSettings.parse`, from the config);
    ``holdings``: what the store holds of the job (default: nothing); ``store``: the run's
    :class:`~.store.held_run.HeldRun` (``None``: no store); ``progress``: a bar told of every
    accepted block's shards; ``shard_seconds``: the pilot's seconds per shard (the block
    timeout from the first block on); ``run_id``: default the job's content address;
    ``shard_bytes``: the pilot's memory per shard and ``workers`` the scheduler's information on
    the workers at the start (both named when the blocks kill their workers); ``threads``: the
    cluster's threads (default: the sum over ``workers``; unknown: the early checks are submitted
    once nothing is left to submit).
    """

    def __init__(self, client: Any, job: Any, reducer: Any, block: int, *, settings: RunSettings | None = None,
                 holdings: Holdings | None = None, store: HeldRun | None = None, progress: Any = None,
                 shard_seconds: float | None = None, run_id: str | None = None, shard_bytes: int | None = None,
                 workers: dict | None = None, threads: int | None = None):
        s = settings if settings is not None else RunSettings.parse()
        self.client, self.job, self.reducer, self.block, self.settings = client, job, reducer, block, s
        self.run_id = run_id if run_id is not None else job.id
        self.store = store
        self.known: dict[int, Any] = dict(holdings.states) if holdings is not None else {}
        self.tag = f"{self.run_id[:12]}-{uuid.uuid4().hex[:6]}"
        if threads is None and workers:
            threads = sum(int(info.get("nthreads") or 0) for info in workers.values()) or None
        self.threads = threads
        self.one_worker = workers is not None and len(workers) == 1   # its checks ride in the last blocks
        self.bounds = block_bounds(job.shards, block)
        self.outcome = Outcome(reused=len(self.known))
        self.events = EventOutbox(client)
        self.limits = Limits(block, shard_seconds, s)
        self.verification = Verification(
            client, job, reducer, run_id=self.run_id, tag=self.tag, k=s.verify, known=self.known, emit=self._emit,
            known_producers=holdings.producers if holdings is not None else None, verify_reused=s.verify_reused,
            limits=self.limits, poll=POLL)
        self.arrivals = Arrivals(client, bound=self.limits.gather_bound)
        target = store.target() if store is not None and s.store_writes == "auto" else None
        self.window = Window(client, job, reducer, self.bounds, tag=self.tag, size=s.window or WINDOW,
                             group_blocks=s.group_blocks, track=self.arrivals.track, known=self.known,
                             keep=self.verification.candidates, target=target, with_store=store is not None)
        self.watch = BlockWatch(client, self.window, self.limits, self.arrivals, speculate=s.speculate,
                                attempts=s.pipeline_attempts, emit=self._emit, outcome=self.outcome, poll=POLL,
                                shard_bytes=shard_bytes, workers=workers)
        self.arrivals.on_unfetched = self.watch.unanswered
        self.acceptance = Acceptance(self.window, reducer, verification=self.verification, watch=self.watch,
                                     emit=self._emit, outcome=self.outcome, store=store, progress=progress)
        if store is not None:
            # Who writes the shard files: the block tasks when the store is reachable from the
            # workers (each worker process checks once, see .blocks), else the client.
            self.outcome.store_writes = store_writes_start(
                s.store_writes, None if target is not None else "research.montecarlo.store-writes is client")

    def _emit(self, kind: str, **data: Any) -> None:
        self.events.emit(kind, self.run_id, **data)

    # -- the run ----------------------------------------------------------------------------------------
    def execute(self) -> tuple[Any, Outcome]:
        """Compute, verify and fold; returns the root state and what happened."""
        self._emit("start", name=self.job.name, shards=self.job.shards, block=self.block, key_prefix=self.tag,
                   reused=len(self.known), client=getattr(self.client, "id", None))
        todo: deque = deque()
        for idx, (a, b) in enumerate(self.bounds):
            if all(s in self.known for s in range(a, b)):
                self.acceptance.from_store(idx)
            else:
                todo.append(idx)
        # Blocks that hold the first verification shards go first, so that their checks run
        # alongside the rest of the run instead of after it. The tree fixes the bits, not the order.
        todo = deque(sorted(todo, key=lambda i: not self.verification.checked_early(*self.bounds[i])))
        # With one worker the early checks ride in the last blocks (no other worker to run them).
        self.window.riders = self.verification.assign_riders(list(todo), self.bounds, one_worker=self.one_worker)
        try:
            self._drain(todo, lambda: self.acceptance.root is not None and not self.window.pending)
            groups = self.window.groups
            self.outcome.groups = {"size": groups.size, "formed": groups.formed, "opened": groups.opened}
            root = self.acceptance.root
            if self.verification.k:
                record, bad, bad_stored = self.verification.verify()
                if bad or bad_stored:
                    root = self._quarantine(bad, bad_stored, record)
                self.outcome.verification = record
            self.outcome.max_in_flight = self.window.max_in_flight
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._stop_fetches()
        return root, self.outcome           # its events are queued; the caller adds done and flushes

    def _stop_fetches(self) -> None:
        """Stop the fetches still in flight (from a holder that never answered): nothing waits for them."""
        for arrivals in (self.arrivals, self.verification.checks.arrivals):
            if arrivals.fetching:
                with contextlib.suppress(Exception):   # a client or loop already closed has none left
                    self.client.sync(arrivals.close, callback_timeout=5)

    def _fail(self, exc: BaseException) -> None:
        """The run fails with ``exc``: cancel what is in flight, log why; raise the lost scheduler's error."""
        lost = lost_scheduler(self.client, exc)
        if not lost:                    # with the scheduler gone, Dask has cancelled them all
            self._cancel_all()
        err = None
        if lost:
            address = getattr(getattr(self.client, "scheduler", None), "address", None)
            err = lost_scheduler_error(exc, address=address, run_id=self.run_id, shards=self.job.shards,
                                       have=len(self.known) + self.outcome.computed,
                                       where=self.store.where if self.store is not None else None)
        self._emit("failed", reason=one_line(err or exc)[:500], error=type(err or exc).__name__)
        self.events.flush(timeout=1.0)   # a failing run (a scheduler gone?) does not wait on its log
        if err is not None:
            raise err from exc

    def _cancel_all(self) -> None:
        futs = self.window.take_all() + self.verification.checks.futures()
        if futs:
            self.client.cancel(futs)

    # -- the driver's loop ------------------------------------------------------------------------------
    def _drain(self, todo: deque, until: Callable[[], bool]) -> None:
        """Driver turns until ``until()``: refill the window, wait once, accept what came, watch the rest."""
        window = self.window
        while not until():
            window.refill(todo)
            if until():
                break
            if not window.pending:
                raise RuntimeError("internal error: nothing pending but the run is not finished")
            done, values = self.client.sync(self._collect, window, POLL)
            if any(f in window.pending and f.status == "cancelled" for f in done):
                # every cancelled future of the window: the one being fetched may have lost its reason
                first = [f for f in done if f in window.pending]
                seen = set(first)
                raise_if_cancelled(self.client, self.run_id, first + [f for f in window.pending if f not in seen])
            for idx, fut in self.acceptance.take(done, values):
                self.watch.failed(idx, fut)
            if self.verification.due and self._last_blocks(todo):
                self.verification.submit_due()
            if window.pending:          # (after the last block: nothing to watch, no round trip)
                self.watch.after_turn(ending=not todo, finished=self.acceptance.block_states)

    def _last_blocks(self, todo: deque) -> bool:
        """Whether no block of the run waits for a thread: nothing left to submit and at most
        as many attempts in flight as the cluster has threads (a turn's cost stays what ended,
        not what is in flight: a speculative copy counts as an attempt, which only holds the
        checks back while it runs).

        Without the cluster's threads, whether nothing is left to submit. (Blocks stuck on a
        frozen worker keep this false: the checks are then submitted by the verification at the
        end, as a check of a worker's first shard always was.)
        """
        if todo:
            return False
        return self.threads is None or len(self.window.pending) <= self.threads

    async def _collect(self, wanted: Any, timeout: float) -> tuple[list, dict]:
        """The one wait of a driver turn, on the client's loop (see :meth:`.Arrivals.collect`)."""
        return await self.arrivals.collect(wanted, timeout)

    # -- a failed verification --------------------------------------------------------------------------
    def _quarantine(self, bad: set[str], bad_stored: set[int], record: dict) -> Any:
        """Recompute, on good workers, what ``bad`` workers produced and the stored files holding ``bad_stored``."""
        stored = self.store.stored_files() if self.store is not None else {}
        dropped, edited = self.verification.dropped(bad, bad_stored, stored)
        self._emit("quarantine", workers=sorted(bad), shards=sorted(dropped))
        self.watch.quarantined |= bad    # the recomputation's copies and retries never go back to them
        good = [w for w in alive_workers(self.client) if w not in bad]
        if not good:
            raise VerificationError(self.run_id, f"workers {sorted(bad)} produced shards that others "
                                    "cannot reproduce, and no other worker is left to recompute them")
        if self.store is not None:
            shown = self.store.quarantine(bad, edited, stored)
            if edited:
                record["quarantined_files"] = shown
        redo = [idx for idx, (a, b) in enumerate(self.bounds) if any(s in dropped for s in range(a, b))]
        for s in dropped:
            self.known.pop(s, None)
        self.acceptance.forget(redo)
        self.window.redo = True
        before = self.outcome.computed
        # Recompute on good workers only; fold everything again on the client (same tree).
        self.window.submit(redo, workers=good)
        states = self.acceptance.block_states
        self._drain(deque(), lambda: all(i in states for i in redo) and not self.window.pending)
        self._cancel_all()
        record["recomputed_shards"] = self.outcome.computed - before
        return tree_fold(self.reducer.merge, [states[i] for i in range(len(self.bounds))])
