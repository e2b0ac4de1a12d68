"""What the driver does about blocks that do not arrive as they should.

After every wait of the driver, :meth:`BlockWatch.after_turn` looks at the blocks in flight:
a group late after one of its blocks finished is opened (its blocks answer one by one, see
:mod:`.groups`), a block running past the block timeout fails the run, and near the end a
straggler is copied to another worker (:mod:`.stragglers`). Both of the last look at every
block in flight, so both run only when the scheduler's view of what runs where was read (at
most once a second, near the end once per ``poll``): a turn of the driver costs what ended, not
what is in flight. A block whose task raised (:meth:`BlockWatch.failed`) is tried again on a
worker it has not failed on, up to ``research.montecarlo.pipeline-attempts`` workers, or fails
the run with the task's own error. A copy or a retry never goes to a worker that failed
verification (:attr:`BlockWatch.quarantined`), nor, while another is left, to one holding
results that cannot be fetched (frozen, most likely).

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> from dask_research.montecarlo.engine import Execution
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=64, seed=1, range=(-8, 8))
>>> watch = Execution(None, job, job.make_reducer(job.range), 2).watch
>>> watch.accepted(["mc-block-t-0-2"], seconds=0.5, computed=2)   # what the first block took
>>> watch.stragglers.durations.median(), watch.limits.expected_shard_seconds()
(0.5, 0.25)
>>> watch.arrivals.holders["mc-block-t-2-4"] = ["tcp://frozen"]  # finished, its result cannot be fetched
>>> watch.unanswered("mc-block-t-2-4", now=10.0)                 # so it is timed as a block still running
>>> watch.stragglers.running["mc-block-t-2-4"]
(10.0, 'tcp://frozen')
"""
from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable
from typing import Any

from .._cluster import workers_info
from ..exceptions import PipelineError
from .arrivals import Arrivals
from .checks import alive_workers, responsive_workers
from .failures import killed_workers_error, one_line
from .imports import looks_unimportable, unimportable_error
from .outcome import Outcome
from .stragglers import Stragglers
from .submission import Window
from .timing import Limits

__all__ = ["BlockWatch"]


class BlockWatch:
    """Hung blocks, stragglers, late groups and failed blocks of one execution.

    ``window`` holds the blocks in flight, ``arrivals`` what could not be fetched,
    ``speculate`` the straggler threshold in median block times (0: no copies), ``attempts``
    the workers a block may fail on before the run fails; ``emit(kind, **data)`` sends a run
    event, ``outcome`` records the retries.
    """

    def __init__(self, client: Any, window: Window, limits: Limits, arrivals: Arrivals, *, speculate: float,
                 attempts: int, emit: Callable[..., None], outcome: Outcome | None = None, poll: float = 0.2,
                 shard_bytes: int | None = None, workers: dict | None = None):
        self.client, self.window, self.limits, self.arrivals = client, window, limits, arrivals
        self.attempts, self.emit = attempts, emit
        self.shard_bytes = shard_bytes                   # the pilot's memory per shard (for a killed worker's error)
        self.workers_at_start = dict(workers or {})      # the workers' memory limits, while none is restarting
        self.outcome = outcome if outcome is not None else Outcome()
        self.stragglers = Stragglers(client, limits, speculate=speculate, poll=poll, bounds=list(window.bounds),
                                     emit=emit)
        self.failed_on: dict[int, dict[str, str]] = {}   # block -> worker -> its error
        self.quarantined: set[str] = set()               # workers that failed verification: never given work again
        self._groups_checked: float | None = None        # when overdue groups were last looked for (None: never)
        self._silent_read: float | None = None           # when missed heartbeats were last looked for (None: never)
        self._silent_workers: set[str] = set()           # workers that missed their heartbeats, then

    # -- what the driver tells it ----------------------------------------------------------------------
    def accepted(self, keys: Iterable[str], seconds: float, computed: int) -> None:
        """A block was accepted (its attempts' ``keys``): it took ``seconds`` for ``computed`` shards."""
        for key in keys:
            self.stragglers.running.pop(key, None)
        if computed:
            self.stragglers.durations.append(seconds)
            self.limits.shard_times.append(seconds / computed)

    def unanswered(self, key: str, now: float) -> None:
        """``key`` finished but its result could not be fetched: time it as a block still running."""
        holders = self.arrivals.holders.get(key) or []
        self.stragglers.unanswered(key, now, holders[0] if len(holders) == 1 else None)

    # -- after every wait ------------------------------------------------------------------------------
    def after_turn(self, ending: bool, finished: Container[int]) -> None:
        """Open late groups, fail the run on a hung block, copy a straggler near the end.

        ``ending``: nothing is left to submit; ``finished``: the blocks accepted so far.
        """
        now = time.monotonic()
        groups = self.window.groups
        if groups and (self._groups_checked is None or now - self._groups_checked >= 1.0):
            self._groups_checked = now
            # A group late after one of its blocks finished: the blocks answer one by one.
            per_shard = self.limits.expected_shard_seconds()
            block = self.stragglers.durations.median() or (per_shard * self.limits.block if per_shard else 1.0)
            for collector in groups.overdue(now, 1.0 + (groups.size + 2) * block, self.arrivals.unfetched):
                a, b = self.window.open_group(collector)
                self.emit("group-opened", start=a, stop=b, reason="late")
        pending, attempts = self.window.pending, self.window.attempts
        processing = self.stragglers.watch(now, pending, ending=ending)
        if processing is not None:       # what runs where was read now: time the blocks in flight
            self.stragglers.check_hung(now, pending, attempts, self.arrivals.outstanding, rescue=self._rescue,
                                       silent=self._silent(now))
        self.stragglers.speculate_copies(now, processing, ending, finished, attempts, self._copy,
                                         self.arrivals.outstanding)

    def _silent(self, now: float) -> set[str]:
        """Workers that missed their heartbeats (frozen, most likely), read at most once a second."""
        if self._silent_read is None or now - self._silent_read >= 1.0:
            self._silent_read = now
            responsive = set(responsive_workers(self.client))
            self._silent_workers = {w for w in alive_workers(self.client) if w not in responsive}
        return self._silent_workers

    def _rescue(self, idx: int, tried: set[str]) -> bool:
        """Copy stuck block ``idx`` to a live worker it has not run on; whether one was left.

        Stuck: every attempt runs on a worker that missed its heartbeats, or past half the
        block timeout (:meth:`.Stragglers.check_hung`). A frozen worker then costs the run its
        blocks' time elsewhere, whatever the run's length; a pipeline that hangs everywhere
        still fails at the block timeout.
        """
        silent = self._silent_workers
        alive = [w for w in alive_workers(self.client) if w not in self.quarantined and w not in tried]
        others = [w for w in alive if w not in silent and w not in self.arrivals.suspects()] or \
            [w for w in alive if w not in silent]
        if not others:
            return False
        self.window.submit([idx], workers=others, speculative=True)
        a, b = self.window.bounds[idx]
        self.emit("rescue", start=a, stop=b, stuck_on=sorted(tried), silent=sorted(w for w in tried if w in silent))
        return True

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
            self.window.submit([idx], workers=others, speculative=True)
            a, b = self.window.bounds[idx]
            self.emit("speculate", start=a, stop=b, slow_worker=slow_worker)

    # -- a block's task raised -------------------------------------------------------------------------
    def failed(self, idx: int, fut: Any) -> None:
        """Try block ``idx`` on a worker it has not failed on, or fail the run with the task's error."""
        exc = fut.exception()
        if looks_unimportable(exc):
            # A graph the scheduler could not deserialize has no traceback to wait for.
            err = unimportable_error(self.client, exc, self.window.job.pipeline, self.window.tag)
            if err is not None:
                raise err from exc
        try:
            tb = fut.traceback(timeout=5)
        except Exception:
            tb = None
        seen = self.stragglers.running.pop(fut.key, None)
        worker = getattr(exc, "worker", None) or (seen[1] if seen else "an unknown worker")
        failures = self.failed_on.setdefault(idx, {})
        failures[worker] = one_line(exc)
        if self.window.in_flight(idx):
            return                                  # a copy elsewhere may still succeed
        from distributed import KilledWorker

        tried = set(failures)
        bad_anywhere = {w for fs in self.failed_on.values() for w in fs}
        others = [w for w in alive_workers(self.client) if w not in tried and w not in self.quarantined]
        others = [w for w in others if w not in bad_anywhere] or others
        a, b = self.window.bounds[idx]
        if isinstance(exc, KilledWorker):
            shards = f"{a}" if b - a == 1 else f"{a}-{b - 1}"
            raise killed_workers_error(exc, shards=shards, block=b - a, samples_per_shard=self.window.job.samples_per_shard,
                                       shard_bytes=self.shard_bytes,
                                       workers={**self.workers_at_start, **workers_info(self.client)}) from exc
        if len(failures) >= self.attempts or not others:
            if len(failures) > 1 and isinstance(exc, PipelineError):
                where = ", ".join(sorted(failures))
                exc = PipelineError(exc.shard, f"{exc.problem}; it failed on every worker tried ({where}): "
                                    "the pipeline, not a worker, is at fault", count=exc.count)
            raise exc.with_traceback(tb)   # the task's own error, e.g. PipelineError(shard=...)
        self.window.drop(idx, fut)
        self.window.submit([idx], workers=others, retry=len(failures))
        self.outcome.retried.append({"block": [a, b], "failed_on": worker, "error": failures[worker],
                                     "retry_on": others})
        self.emit("retry", start=a, stop=b, failed_on=worker, error=failures[worker][:300])
