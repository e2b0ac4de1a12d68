"""The driver: pick a branch, start an experiment, record the result, repeat.

:class:`IterationScheduler` owns a :class:`~.ledger.BranchLedger` (queues and statistics), asks
the policy for a branch whenever a slot is free, starts the branch's oldest queued hypothesis
on a backend (asyncio tasks, or Dask futures with a client), and on every result applies the
gates in order: pruning, paper trigger, expansion. It never blocks behind one experiment: it
sleeps until *any* experiment finishes and refills the freed slot at once.
"""
from __future__ import annotations

import asyncio
import heapq
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import config
from ..exceptions import ExperimentError, InputError
from . import policies
from .backends import DaskBackend, LocalBackend
from .checkpoint import Journal, JournalState
from .events import Event, Trace, _jsonable
from .execute import is_async_callable
from .ledger import BranchLedger, ScoreFn
from .report import Report
from .types import BranchStats, Hypothesis, Result

__all__ = ["IterationScheduler"]

_LOG_TOP_SCORES = 32   # select events in the Dask event log carry the best 32 scores


def _number(name: str, value: Any, expected: str, ok: Callable[[float], bool]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise InputError(name, value, expected, where="IterationScheduler")
    return value


class IterationScheduler:
    """UCB iteration scheduler: hypotheses in branches feed ``slots`` parallel experiments.

    Every keyword that is ``None`` is read from ``research.experiments.*`` in ``dask.config``
    when the scheduler is created.

    Parameters
    ----------
    runner : callable
        ``Hypothesis -> Result``, sync or ``async def``. It may also return a bare reward
        (a number) or a ``(reward, metrics)`` pair; the scheduler wraps it and measures the
        duration. Exceptions and unusable returns become failed results; they never stop the
        loop. With a client the runner must pickle.
    slots : int
        Experiments in flight at once (``>= 1``).
    c : float
        UCB1 exploration constant (``>= 0``; default sqrt 2).
    prune_after_runs : int
        Completed runs before the pruning gate looks at a branch.
    prune_floor : float
        A branch whose mean is below this after ``prune_after_runs`` runs is pruned: it is
        never selected again and its queued hypotheses are dropped (and listed in the report).
    paper_threshold : float
        The first time a branch's mean exceeds this, ``paper.trigger`` is recorded and
        ``paper_writer`` (if any) starts in parallel.
    expander : callable, optional
        ``Result -> list[Hypothesis]``, called on every successful result; its hypotheses are
        queued (e.g. :data:`~.runners.deterministic_expander`). Keep it pure and cheap: it runs
        on the loop.
    paper_writer : callable, optional
        ``(branch, stats, best_result) -> anything``, sync or ``async def``; runs as a task
        (or a Dask future) and never blocks the loop. Its return values are in
        ``report.papers``; the run waits for unfinished writers before returning.
    max_experiments : int, optional
        Stop dispatching after this many experiments (this run).
    max_seconds : float, optional
        Stop dispatching after this many seconds of wall clock (this run).
    client : distributed.Client, optional
        Run experiments as Dask futures on this client (sync or asynchronous). Without one
        they run as asyncio tasks in this process (sync runners in a thread per slot).
    failure_limit : int, optional
        Failed experiments a branch may have before it is pruned (``research.experiments.
        failure-limit``; ``0`` disables the limit).
    bounded : bool, optional
        Rewards lie in [0, 1] (``research.experiments.bounded-rewards``). Then ``prune_floor``
        and ``paper_threshold`` must lie in [0, 1] and rewards outside it are failures.
    progress : bool, optional
        Show a ``tqdm.auto`` progress bar (``research.experiments.progress``).
    policy : callable, optional
        ``policy(mean, n, c, total) -> scores`` over numpy arrays in branch order
        (default :func:`~.policies.ucb1_scores`); for baselines and experiments with policies.
    log_events : bool, optional
        With a client, forward events to the Dask event log under
        ``research.experiments.event-topic`` (``research.experiments.log-events``).
    checkpoint : str or path, optional
        A journal file (JSON lines) of finished experiments for crash-safe resume: a later run
        with the same checkpoint and hypotheses counts the recorded results instead of running
        them again (see :mod:`dask_research.experiments.checkpoint`).

    Examples
    --------
    >>> from dask_research.experiments import (Hypothesis, IterationScheduler,
    ...                                        make_deterministic_runner)
    >>> runner = make_deterministic_runner({"attention": 0.8, "recurrence": 0.1}, delay_ms=1)
    >>> sched = IterationScheduler(runner, slots=3, progress=False)
    >>> sched.add([Hypothesis(f"{b}-{k}", b) for k in range(4)
    ...            for b in ("attention", "recurrence")])
    >>> report = sched.run()                 # or: report = await sched.run_async()
    >>> report.stop_reason, report.branches["recurrence"].pruned, report.paper_triggers
    ('queue_empty', 'low-mean', ['attention'])
    """

    def __init__(
        self,
        runner: Callable[[Hypothesis], Any],
        slots: int | None = None,
        c: float | None = None,
        prune_after_runs: int | None = None,
        prune_floor: float | None = None,
        paper_threshold: float | None = None,
        expander: Callable[[Result], Iterable[Hypothesis]] | None = None,
        paper_writer: Callable[..., Any] | None = None,
        max_experiments: int | None = None,
        max_seconds: float | None = None,
        client: Any = None,
        failure_limit: int | None = None,
        bounded: bool | None = None,
        progress: bool | None = None,
        policy: ScoreFn | None = None,
        log_events: bool | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
    ):
        if not callable(runner):
            raise ExperimentError(
                f"runner must be callable (Hypothesis -> Result), got {type(runner).__name__}",
                value=runner)
        for name, fn in (("expander", expander), ("paper_writer", paper_writer)):
            if fn is not None and not callable(fn):
                raise ExperimentError(f"{name} must be callable or None, got "
                                      f"{type(fn).__name__}", value=fn)
        if expander is not None and is_async_callable(expander):
            raise ExperimentError(
                "expander must be a plain function Result -> list[Hypothesis] (it runs on the "
                "loop between decisions); put slow or async work in the runner or the "
                "paper_writer", value=expander)
        self.runner = runner
        self.slots = int(_number("slots", config.get("experiments.slots", slots),
                                 "an integer >= 1", lambda v: v >= 1 and v == int(v)))
        self.c = float(_number("c", config.get("experiments.c", c),
                               "a finite number >= 0 (sqrt 2 is the UCB1 default)",
                               lambda v: math.isfinite(v) and v >= 0))
        self.prune_after_runs = int(_number(
            "prune_after_runs", config.get("experiments.prune-after-runs", prune_after_runs),
            "an integer >= 1", lambda v: v >= 1 and v == int(v)))
        self.bounded = bool(config.get("experiments.bounded-rewards", bounded))
        in_range = (lambda v: 0.0 <= v <= 1.0) if self.bounded else math.isfinite
        expected = ("a number in [0, 1] (rewards are bounded; pass bounded=False for other "
                    "reward scales)") if self.bounded else "a finite number"
        self.prune_floor = float(_number(
            "prune_floor", config.get("experiments.prune-floor", prune_floor), expected,
            in_range))
        self.paper_threshold = float(_number(
            "paper_threshold", config.get("experiments.paper-threshold", paper_threshold),
            expected, in_range))
        limit = config.get("experiments.failure-limit", failure_limit)
        self.failure_limit = int(_number("failure_limit", limit, "an integer >= 0 (0: no limit)",
                                         lambda v: v >= 0 and v == int(v))) or None
        if max_experiments is not None:
            _number("max_experiments", max_experiments, "an integer >= 0 or None",
                    lambda v: v >= 0 and v == int(v))
        if max_seconds is not None:
            _number("max_seconds", max_seconds, "a number > 0 or None", lambda v: v > 0)
        self.max_experiments = max_experiments
        self.max_seconds = max_seconds
        self.expander = expander
        self.paper_writer = paper_writer
        self.client = client
        self.progress = bool(config.get("experiments.progress", progress))
        self.log_events = bool(config.get("experiments.log-events", log_events))
        self.topic: str = config.get("experiments.event-topic")
        if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
            raise InputError("checkpoint", checkpoint, "a file path (str or os.PathLike) or None",
                             where="IterationScheduler")
        self.checkpoint = checkpoint
        self.ledger = BranchLedger(self.c, policy)
        self._journal: Journal | None = None
        self._past = JournalState()
        self._running = False
        self._dropped: list[str] = []
        self._trace: Trace | None = None
        self._t0 = 0.0

    def __repr__(self) -> str:
        mode = "dask" if self.client is not None else "asyncio"
        return (f"<IterationScheduler {mode}: {len(self.ledger.branches)} branches, "
                f"{self.ledger.total_queued} queued, slots={self.slots}, c={self.c:g}>")

    # -- input --------------------------------------------------------------------------
    def add(self, hypotheses: Hypothesis | Iterable[Hypothesis]) -> None:
        """Queue hypotheses (before a run, or from the loop's thread while it runs).

        Raises :class:`ExperimentError` for duplicate ids (within the batch or with anything
        added before) and for objects that are not :class:`Hypothesis`; then nothing is queued.
        Hypotheses for an already pruned branch are dropped and recorded (``drop`` event).
        """
        if isinstance(hypotheses, Hypothesis):
            hypotheses = [hypotheses]
        dropped = self.ledger.add(hypotheses)
        if dropped:
            self._dropped.extend(h.id for h in dropped)
            if self._running:
                for h in dropped:
                    self._emit("drop", branch=h.branch, hypothesis=h.id, reason="pruned")

    @property
    def stats(self) -> dict[str, BranchStats]:
        """``{branch: BranchStats}`` now."""
        return self.ledger.snapshot()

    # -- running ------------------------------------------------------------------------
    def run(self) -> Report:
        """Run until the queue is empty or a budget stops dispatching; returns the report.

        Without a client this runs its own event loop (in a helper thread if one is already
        running here, as in Jupyter). With a synchronous client the driver runs on the
        client's loop. With an asynchronous client use ``await run_async()``.
        """
        if self.client is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.run_async())
            box: dict[str, Any] = {}

            def target() -> None:
                try:
                    box["report"] = asyncio.run(self.run_async())
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                    box["error"] = exc

            t = threading.Thread(target=target, name="IterationScheduler")
            t.start()
            t.join()
            if "error" in box:
                raise box["error"]
            return box["report"]
        if getattr(self.client, "asynchronous", False) or getattr(self.client, "_asynchronous",
                                                                  False):
            raise ExperimentError(
                "the client is asynchronous; use `report = await sched.run_async()` instead of "
                "sched.run()")
        return self.client.sync(self._drive)

    async def run_async(self) -> Report:
        """Coroutine version of :meth:`run` (for asynchronous clients and notebooks)."""
        if self.client is None:
            return await self._drive()
        from distributed.utils import in_async_call

        if in_async_call(self.client.loop):
            return await self._drive()
        cf = asyncio.run_coroutine_threadsafe(self._drive(), self.client.loop.asyncio_loop)
        return await asyncio.wrap_future(cf)

    # -- the loop -----------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _emit(self, kind: str, branch: str | None = None, hypothesis: str | None = None,
              slot: int | None = None, scores: Any = None, **data: Any) -> None:
        trace = self._trace
        assert trace is not None
        data["queued"] = self.ledger.n_queued
        trace._events.append(Event(len(trace._events), time.perf_counter() - self._t0, kind,
                                   branch, hypothesis, slot, data, scores))

    def _budget_reason(self, dispatched: int) -> str | None:
        if self.max_experiments is not None and dispatched >= self.max_experiments:
            return "max_experiments"
        if self.max_seconds is not None and self._now() >= self.max_seconds:
            return "max_seconds"
        return None

    async def _drive(self) -> Report:
        if self._running:
            raise ExperimentError("this scheduler is already running; one run at a time")
        if self.checkpoint is not None:       # a bad checkpoint raises before anything runs
            self._journal = Journal(self.checkpoint)
            self._past = self._journal.load()     # opened for appending at the first record
        self._running = True
        run_id = uuid.uuid4().hex[:12]
        ledger = self.ledger
        self._t0 = time.perf_counter()
        trace = self._trace = Trace(self.slots, ledger.branches, started_at=time.time())
        results: list[Result] = []
        failed: list[Result] = []
        triggers: list[str] = []
        papers: dict[str, Any] = {}
        side: list[asyncio.Future] = []
        if self.client is None:
            backend: LocalBackend | DaskBackend = LocalBackend(self.runner, self.slots,
                                                               self.bounded)
        else:
            backend = DaskBackend(self.client, self.runner, self.bounded,
                                  self.topic if self.log_events else None, run_id)
        bar = self._progress_bar()
        free = list(range(self.slots))
        inflight: dict[Any, tuple[Hypothesis, int]] = {}
        stop_reason: str | None = None
        dispatched = 0
        replayed = 0
        shipped = 0
        if ledger.total_queued:
            self._emit("add", n=ledger.total_queued, nbranches=len(ledger.branches))
        try:
            while True:
                # 1. fill every free slot (budgets are checked only when there is work)
                while free and stop_reason is None:
                    if not ledger.has_work():
                        break
                    reason = self._budget_reason(dispatched)
                    if reason is not None:
                        stop_reason = reason
                        self._emit("stop", reason=reason, in_flight=len(inflight))
                        break
                    i, scores = ledger.select()  # type: ignore[misc]
                    h = ledger.pop(i)
                    prior = self._past.outcome(h) if self._past.results else None
                    if prior is not None:     # in the checkpoint: count it, do not run it
                        self._emit("select", h.branch, h.id, None, scores,
                                   score=float(scores[i]), replayed=True)
                        replayed += 1
                        self._on_outcome(h, None, prior, results, failed, triggers, papers,
                                         side, backend, replayed=True)
                        continue
                    slot = heapq.heappop(free)
                    self._emit("select", h.branch, h.id, None, scores, score=float(scores[i]))
                    inflight[backend.submit(h)] = (h, slot)
                    dispatched += 1
                    self._emit("dispatch", h.branch, h.id, slot)
                if stop_reason is None and ledger.has_work() and not free:
                    reason = self._budget_reason(dispatched)
                    if reason is not None:
                        stop_reason = reason
                        self._emit("stop", reason=reason, in_flight=len(inflight))
                if self.log_events and self.client is not None:
                    backend.ship(self._records(trace, shipped, run_id))
                    shipped = len(trace)
                if not inflight:
                    break
                # 2. sleep until any experiment finishes (or the wall-clock budget runs out)
                timeout = None
                if (self.max_seconds is not None and stop_reason is None
                        and ledger.has_work()):
                    timeout = max(0.0, self.max_seconds - self._now())
                for token, outcome in await backend.wait(timeout):
                    h, slot = inflight.pop(token)
                    heapq.heappush(free, slot)
                    self._on_outcome(h, slot, outcome, results, failed, triggers, papers,
                                     side, backend)
                if bar is not None:         # update() redraws at most every 0.1 s
                    done = len(results) + len(failed)
                    bar.total = done + len(inflight) + ledger.total_queued
                    bar.update(done - bar.n)
            if stop_reason is None:
                stop_reason = "queue_empty"
                self._emit("stop", reason=stop_reason, in_flight=0)
            if side:
                await asyncio.gather(*side, return_exceptions=True)
            if self.log_events and self.client is not None:
                backend.ship(self._records(trace, shipped, run_id))
        finally:
            if bar is not None:
                bar.close()
            await backend.close()
            if self._journal is not None:
                self._journal.close()
                self._journal, self._past = None, JournalState()
            self._running = False
        return Report(
            stop_reason=stop_reason,
            branches=ledger.snapshot(),
            total_runs=len(results),
            dispatched=dispatched,
            failures=len(failed),
            wall_seconds=self._now(),
            paper_triggers=triggers,
            papers=papers,
            events=trace,
            results=results,
            failed=failed,
            dropped=self._take_dropped(),
            slots=self.slots,
            run_id=run_id,
            replayed=replayed,
        )

    def _take_dropped(self) -> list[str]:
        out, self._dropped = self._dropped, []
        return out

    def _records(self, trace: Trace, start: int, run_id: str) -> list[dict]:
        """Event records for the Dask log, in the project's vocabulary (``{"event": kind,
        "run": run_id, ...}``); select records keep only the best 32 scores."""
        out = []
        for ev in trace[start:]:
            scores = ev.scores
            if scores is not None and len(scores) > _LOG_TOP_SCORES:
                ev.scores = None
                d = ev.to_dict()
                ev.scores = scores
                top = np.argsort(-scores, kind="stable")[:_LOG_TOP_SCORES].tolist()
                d["scores"] = {trace.branches[j]: _jsonable(float(scores[j])) for j in top}
                d["scores_truncated"] = len(scores)
            else:
                d = ev.to_dict(trace.branches)
            d["event"] = d.pop("kind")
            d["run"] = run_id
            out.append(d)
        return out

    def _progress_bar(self) -> Any:
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.ledger.total_queued, desc="experiments", unit="exp",
                    leave=False)

    def _on_outcome(self, h: Hypothesis, slot: int | None, outcome: Any,  # noqa: C901
                    results: list[Result],
                    failed: list[Result], triggers: list[str], papers: dict[str, Any],
                    side: list[asyncio.Future], backend: LocalBackend | DaskBackend,
                    replayed: bool = False) -> None:
        ledger = self.ledger
        ok = isinstance(outcome, Result) and outcome.ok
        extra = {"replayed": True} if replayed else {}
        if ok:
            i = ledger.record(outcome)
            runs, mean = int(ledger.runs[i]), float(ledger.mean[i])
            results.append(outcome)
            self._emit("result", h.branch, h.id, slot, reward=outcome.reward,
                       duration=outcome.duration, mean=mean, runs=runs, **extra)
            res = outcome
        else:
            res = outcome if isinstance(outcome, Result) else Result.failure(h, outcome)
            i = ledger.record_failure(h)
            runs = int(ledger.runs[i])
            mean = float(ledger.mean[i]) if runs else math.nan
            failed.append(res)
            self._emit("failure", h.branch, h.id, slot, error=res.error,
                       failures=int(ledger.failures[i]), **extra)
        if self._journal is not None and not replayed:
            self._journal.record(res)
        # gate 1: pruning
        if not ledger.pruned[i]:
            reason = policies.prune_reason(runs, mean, int(ledger.failures[i]),
                                           self.prune_after_runs, self.prune_floor,
                                           self.failure_limit)
            if reason is not None:
                dropped = ledger.prune(i, reason)
                self._dropped.extend(d.id for d in dropped)
                self._emit("prune", h.branch, reason=reason, mean=mean, runs=runs,
                           failures=int(ledger.failures[i]), dropped=[d.id for d in dropped])
                return
        if not ok or ledger.pruned[i]:
            return
        # gate 2: paper trigger, once per branch
        if policies.should_trigger_paper(runs, mean, self.paper_threshold,
                                         bool(ledger.paper[i])):
            ledger.paper[i] = True
            triggers.append(h.branch)
            written = h.branch in self._past.papers
            self._emit("paper.trigger", h.branch, h.id, mean=mean, runs=runs,
                       threshold=self.paper_threshold,
                       **({"replayed": True} if written else {}))
            if written:                       # written before the restart: not again
                papers[h.branch] = self._past.papers[h.branch]
            elif self.paper_writer is not None:
                stats = ledger.stats(i)
                side.append(self._start_paper(h.branch, stats, outcome, papers, backend))
        # gate 3: expansion
        if self.expander is not None:
            self._expand(outcome)

    def _start_paper(self, branch: str, stats: BranchStats, best: Result,
                     papers: dict[str, Any], backend: LocalBackend | DaskBackend) -> Any:
        fut = backend.side(self.paper_writer, branch, stats, best)  # type: ignore[arg-type]
        journal = self._journal

        async def watch() -> None:
            try:
                papers[branch] = await fut
                self._emit("paper.done", branch=branch)
                if journal is not None:
                    journal.record_paper(branch, papers[branch])
            except Exception as exc:  # noqa: BLE001 - a failed paper never stops the loop
                papers[branch] = f"<{type(exc).__name__}: {exc}>"
                self._emit("paper.failed", branch=branch, error=f"{type(exc).__name__}: {exc}")

        return asyncio.ensure_future(watch())

    def _expand(self, result: Result) -> None:
        h = result.hypothesis
        try:
            new = list(self.expander(result))  # type: ignore[misc]
            wrong = [x.id for x in new if isinstance(x, Hypothesis) and x.branch != h.branch]
            batch = BranchLedger.check(new, self.ledger.ids)
        except Exception as exc:  # noqa: BLE001 - a faulty expander must not kill the loop
            self._emit("expand", branch=h.branch, hypothesis=h.id, ids=[],
                       error=f"{type(exc).__name__}: {exc}")
            return
        if not batch:
            return
        dropped = self.ledger.add(batch)
        self._dropped.extend(d.id for d in dropped)
        self._emit("expand", branch=h.branch, hypothesis=h.id, ids=[x.id for x in batch],
                   **({"other_branches": wrong} if wrong else {}))
