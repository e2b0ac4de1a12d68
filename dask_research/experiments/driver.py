"""The asyncio loop of :meth:`~.loop.IterationScheduler.run`: fill the slots, sleep until any
experiment finishes, book it and refill its slot at once, repeat.

:class:`LoopDriver` drives one :class:`~.scheduler_run.Run` on a backend (asyncio tasks, or Dask futures
with a client). It never blocks behind one experiment: a finished experiment is booked and
its slot refilled inside its own task (the local backend's completion hook), before the books
of any other. With queue-ahead (:mod:`.ahead`) each slot also holds up to ``depth`` decided
experiments behind its running one: on a Dask cluster they wait in the cluster and start
when a thread frees, without the driver; the slot's next one is then decided ahead again.
With ``apply_order="dispatch"`` results are applied in dispatch order and decision ``k``
waits for result ``k - slots x (1 + depth)``. Experiments past their ``timeout`` (counted
from when they start running, not from when they were queued) fail; past ``max_seconds +
cancel_grace`` every experiment still in flight is cancelled and kept in
:attr:`LoopDriver.carry` for the next run.

Examples
--------
>>> from dask_research.experiments import Hypothesis, IterationScheduler
>>> sched = IterationScheduler(lambda h: 0.5, slots=2, progress=False)
>>> sched.add([Hypothesis(f"h{k}", "a") for k in range(3)])
>>> [e.kind for e in sched.run().events][:4]      # a LoopDriver ran it
['add', 'select', 'dispatch', 'select']
"""
from __future__ import annotations

import asyncio
import heapq
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from .._compat import client_status, cluster_threads
from ..exceptions import ExperimentError
from .actors import ActorBackend
from .ahead import AheadRule
from .backends import ClusterCancelled, DaskBackend, LocalBackend
from .decision_trace import _jsonable
from .progress_bar import ProgressBar
from .recorder import log_records
from .report import Report
from .scheduler_run import Run
from .timeouts import Deadlines, ExperimentTimeout
from .types import BranchStats, ExperimentResult, Hypothesis

__all__ = ["LoopDriver", "CANCELLED"]

CANCELLED = object()   # outcome of an experiment cancelled at the run's deadline: not counted

#: Seconds a cluster may have no worker at all, while experiments are in flight, before the run
#: warns that it is waiting for one (once per such stretch).
NO_WORKERS_WARN = 30.0
#: How often, at most, a run with experiments on a cluster looks at the cluster's workers.
WORKERS_POLL = 2.0


class _Flight:
    """One experiment in flight: its hypothesis, slot, dispatch sequence number and time;
    ``waiting`` while it is queued ahead behind its slot's running experiment; ``started``
    once a queued one has said it started on a worker."""

    __slots__ = ("h", "slot", "seq", "t", "ahead", "waiting", "started")

    def __init__(self, h: Hypothesis, slot: int, seq: int, t: float, ahead: bool) -> None:
        self.h, self.slot, self.seq, self.t = h, slot, seq, t
        self.ahead = self.waiting = ahead
        self.started = not ahead


class _Held:
    """The token of an experiment queued ahead in the driver (the local backend): it is handed
    to the backend when its slot frees."""

    __slots__ = ()


class LoopDriver:
    """Slots, experiments in flight and budgets of one run on ``backend``.

    ``paper_writer(branch, stats, best)`` runs as a side task of the backend; ``client`` is
    only named in error messages and decides whether events are shipped to the Dask log.
    """

    def __init__(self, run: Run, backend: LocalBackend | DaskBackend | ActorBackend,
                 paper_writer: Callable[..., Any] | None = None, client: Any = None) -> None:
        s = run.settings
        self.run, self.backend, self.client = run, backend, client
        self.slots = s.slots
        self.paper_writer = paper_writer
        self.retry = run.books.retry
        self.carry: list[Hypothesis] = []       # cancelled at the deadline: the next run's
        self.free = list(range(s.slots))
        self.inflight: dict[Any, _Flight] = {}
        self.lanes: list[deque[Any]] = [deque() for _ in range(s.slots)]   # queued ahead, per slot
        # "auto" queues forced picks (the same whenever decided) and, by timing, where the
        # round trip is worth hiding; never where no round trip is to be hidden (the local
        # backend), and not by timing where decisions must not depend on it ("dispatch")
        self.ahead = AheadRule(s.queue_ahead, s.queue_ahead_gap, enabled=backend.queues_in_cluster,
                               timed=s.apply_order != "dispatch")
        # the backend says when each experiment starts (its timeout counts from then)
        self.starts_reported = bool(getattr(backend, "reports_starts", False))
        self.started_early: set[Any] = set()     # starts reported before their token was booked
        self._refused = False                    # warned that the cluster has spare threads
        self.buffered: dict[int, tuple[Hypothesis, int, Any]] = {}
        self.by_dispatch = s.apply_order == "dispatch"
        self.next_seq = 0                        # dispatch sequence numbers of this run
        self.applied = 0
        self.dispatched = 0
        self.stop_reason: str | None = None
        self.deadlines = Deadlines(s.timeout)
        self.hard = None if s.max_seconds is None else s.max_seconds + s.cancel_grace
        self.cancelled: list[str] = []
        self.timed_out: list[str] = []
        self.side: list[asyncio.Future] = []
        self.crashed: list[BaseException] = []
        self.closing = False                # the run is over: a task that ends now is not booked
        self.ship = s.log_events and client is not None
        self._no_workers_since: float | None = None   # when the cluster was seen without workers
        self._no_workers_warned = False
        if paper_writer is not None:
            run.on_trigger = self.start_paper
        if isinstance(backend, LocalBackend):
            backend.on_finish = self.on_finish
        else:
            backend.on_start = self.on_start

    # -- slots ---------------------------------------------------------------------------
    def depth(self) -> int:
        """Experiments to keep queued ahead per slot now: the rule's (:mod:`.ahead`), if the
        backend can queue without running more than ``slots`` experiments at once."""
        rule = self.ahead
        want = rule.depth(forced=rule.auto and rule.enabled and self.run.ledger.forced_pick())
        if want and not self.backend.can_queue(self.slots):
            if not self.ahead.auto and not self._refused:
                self._refused = True
                warnings.warn(f"queue_ahead={want} is not applied while the cluster has more threads "
                              f"than slots={self.slots}: a queued experiment would start at once on a "
                              "spare thread and more than slots experiments would run", stacklevel=2)
            return 0
        return want

    def _place(self, depth: int) -> tuple[int, bool] | None:
        """Where the next decision goes: ``(slot, ahead)``, a free slot first, else the slot
        with the shortest queue under ``depth``; ``None``: nowhere."""
        if self.free:
            return self.free[0], False
        if depth:
            slot = min(range(self.slots), key=lambda k: (len(self.lanes[k]), k))
            if len(self.lanes[slot]) < depth:
                return slot, True
        return None

    def fill(self) -> None:
        """Fill every free slot, then queue ahead (budgets are checked only when there is work)."""
        run, led, retry = self.run, self.run.ledger, self.retry
        while self.stop_reason is None:
            depth = self.depth()
            place = self._place(depth)
            if place is None:
                return
            if self.by_dispatch and self.next_seq - self.applied >= self.slots * (1 + depth):
                return                    # decision k waits for result k - slots x (1 + depth)
            if not retry and not led.has_work() and not run.revive_parked(self.dispatched):
                return
            reason = run.budget_reason(self.dispatched)
            if reason is not None:
                self.stop_reason = reason
                run.recorder.emit("stop", reason=reason, in_flight=len(self.inflight))
                return
            if retry:                     # in flight at the crash: again, once
                self.start(retry.popleft(), *place, requeued=True)
                continue
            h = run.pick()
            if h is not None:             # None: its source is exhausted, decide again
                self.start(h, *place)

    def start(self, h: Hypothesis, slot: int | None = None, ahead: bool = False, **data: Any) -> None:
        """Hand ``h`` to the backend on ``slot`` (default: the lowest free one), or, ``ahead``,
        queue it behind the experiment running there. The dispatch event is stamped as the
        hand-off begins: from here the slot is committed, and the hand-off itself (Dask's
        ``client.submit`` packs and pickles the task) is transport, like the round trip, not
        decision time."""
        if not ahead:
            slot = heapq.heappop(self.free)
        assert slot is not None
        if ahead:
            data["ahead"] = True
        self.run.recorder.emit("dispatch", h.branch, h.id, slot, **data)
        self.run.recorder.commit()        # the decision is journaled whole before it is carried out
        now = self.run.recorder.now()
        token: Any = (_Held() if ahead and not self.backend.queues_in_cluster
                      else self._submit(h, ahead, slot))
        self.inflight[token] = _Flight(h, slot, self.next_seq, now, ahead)
        if ahead:
            self.lanes[slot].append(token)
        elif not self.starts_reported:
            self.deadlines.start(token, now)
        if token in self.started_early:   # the backend said it started inside submit()
            self.started_early.discard(token)
            self.on_start(token)
        self.next_seq += 1
        self.dispatched += 1

    def _submit(self, h: Hypothesis, ahead: bool = False, slot: int | None = None) -> Any:
        try:
            return self.backend.submit(h, ahead, slot)
        except Exception as exc:
            raise ExperimentError(
                f"could not start hypothesis {h.id!r} on branch {h.branch!r}: "
                f"{type(exc).__name__}: {exc}" + ("; with a client the runner and every "
                "payload must pickle" if self.client is not None else ""),
                id=h.id, branch=h.branch) from exc

    def _vacate(self, token: Any, f: _Flight) -> None:
        """``token`` left its slot: the next experiment queued there starts (handed to the
        local backend now; on a cluster it already waits there), or the slot is free."""
        if f.waiting:                     # done while queued ahead: it found a thread of its own
            self.lanes[f.slot].remove(token)
            return
        lane = self.lanes[f.slot]
        if not lane:
            heapq.heappush(self.free, f.slot)
            return
        nxt = lane.popleft()
        g = self.inflight[nxt]
        g.waiting = False
        if isinstance(nxt, _Held):
            del self.inflight[nxt]
            nxt = self._submit(g.h, slot=g.slot)
            self.inflight[nxt] = g
            g.started = True
            self.deadlines.start(nxt, self.run.recorder.now())
        elif not self.starts_reported:
            # on a cluster it may start later than this (behind another experiment on its
            # worker): its timeout counts from the start it reports (on_start), and at the
            # latest from now, when the one before it in its slot has ended, as it would have
            # without queue-ahead: behind a frozen worker it never starts nor says so, and the
            # run waited for it until Dask gave the worker up (minutes). Actors need not: a
            # retiring actor hands what waits in it to the slot's next actor (see .actors)
            self.deadlines.start_by(nxt, self.run.recorder.now())

    def on_start(self, token: Any) -> None:
        """An experiment says it started on a worker: its timeout counts from now. A backend
        may say so inside ``submit`` (an idle slot's actor), before the token is booked: it is
        applied as the token is (an experiment of an idle actor used to have no clock at all)."""
        if token not in self.inflight:
            if self.deadlines.timeout is not None:
                self.started_early.add(token)
            return
        if self.deadlines.timeout is not None:
            self.inflight[token].started = True
            self.deadlines.start(token, self.run.recorder.now())
            self.backend.poke()

    def _observe(self, f: _Flight, outcome: Any) -> None:
        """Feed the queue-ahead rule: the idle gap of an experiment that started on a free
        slot (dispatch to result, less its own duration) and every experiment's duration."""
        duration = getattr(outcome, "duration", None)
        if not isinstance(duration, (int, float)):
            return
        gap = None if f.ahead else self.run.recorder.now() - f.t - duration
        self.ahead.observe(gap, duration)

    def settle(self, token: Any, outcome: Any) -> None:
        """Book one finished experiment and refill its slot at once, before the books
        of any other finished experiment (so a slot waits for its own bookkeeping only)."""
        f = self.inflight.pop(token)
        h, slot, k = f.h, f.slot, f.seq
        self.deadlines.discard(token)
        self._vacate(token, f)
        if outcome is not CANCELLED:
            self._observe(f, outcome)
        if not self.by_dispatch:
            if outcome is not CANCELLED:
                self.run.apply(h, slot, outcome)
            self.fill()
            self.run.recorder.commit()    # the outcome's step, when no experiment started after it
            return
        if outcome is not CANCELLED:
            self.run.recorder.emit("finish", h.branch, h.id, slot)
        self.buffered[k] = (h, slot, outcome)
        while self.applied in self.buffered:   # apply in dispatch order, and make decision
            hh, ss, oo = self.buffered.pop(self.applied)   # k right after result k - slots
            self.applied += 1
            if oo is not CANCELLED:       # a cancelled one is skipped, not waited for
                self.run.apply(hh, ss, oo)
            self.fill()
        self.run.recorder.commit()

    def on_finish(self, token: Any, outcome: Any) -> None:
        """Completion hook of the local backend: runs inside the finished experiment's own
        task, so the slot is refilled without waiting for the driver to wake up."""
        if self.crashed or self.closing or token not in self.inflight:
            return
        try:
            self.settle(token, outcome)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the driver
            self.crashed.append(exc)

    # -- papers --------------------------------------------------------------------------
    def start_paper(self, branch: str, stats: BranchStats, best: ExperimentResult) -> None:
        """Start the paper writer of ``branch`` as a side task (it never blocks the loop)."""
        run = self.run
        fut = self.backend.side(self.paper_writer, branch, stats, best)  # type: ignore[arg-type]

        async def watch() -> None:
            try:
                out = await fut
                run.books.paper(branch, out)
                if run.recorder.journal is not None:
                    run.recorder.write({"kind": "output", "branch": branch,
                                        "output": _jsonable(out)})
                run.recorder.emit("paper.done", branch=branch)
                run.recorder.commit()
            except asyncio.CancelledError:   # the run's deadline: written again on resume
                run.books.paper(branch, "<cancelled: still writing at the run's deadline>")
            except Exception as exc:  # noqa: BLE001 - a failed paper never stops the loop
                error = f"{type(exc).__name__}: {exc}"
                run.books.paper_failed(branch, error)
                run.recorder.emit("paper.failed", branch=branch, error=error)
                run.recorder.commit()

        self.side.append(asyncio.ensure_future(watch()))

    # -- the loop ------------------------------------------------------------------------
    async def drive(self, bar: ProgressBar | None) -> Report:  # noqa: C901 - one piece
        """Run until the queue is empty or a budget stops dispatching; the report."""
        run, backend, books = self.run, self.backend, self.run.books
        led, rec, inflight = run.ledger, run.recorder, self.inflight
        s = run.settings
        shipped = 0
        try:
            if led.total_queued or self.retry:
                again: dict[str, Any] = ({"requeued": [h.id for h in self.retry]}
                                         if self.retry else {})
                rec.emit("add", n=led.total_queued, nbranches=len(led.branches), **again)
            if self.paper_writer is not None:
                for b in books.triggers:        # triggered, but no paper before the crash
                    if b not in books.papers and b in books.trigger_results:
                        self.start_paper(b, led.stats(led.branch_index(b)),
                                         books.trigger_results[b])
            while True:
                # 1. fill every free slot
                self.fill()
                if self.stop_reason is None and led.has_work() and not self.free:
                    reason = run.budget_reason(self.dispatched)
                    if reason is not None:
                        self.stop_reason = reason
                        rec.emit("stop", reason=reason, in_flight=len(inflight))
                rec.commit()        # decisions alone (a stop, an exhausted source): never held across a wait
                if self.ship:
                    backend.ship(log_records(run.trace, shipped, run.run_id))
                    shipped = len(run.trace)
                if not inflight:
                    break
                # 2. sleep until any experiment finishes (or the wall-clock budget runs out)
                now = rec.now()
                waits = [self.deadlines.next_in(now)]
                if self.hard is not None:
                    waits.append(max(0.0, self.hard - now))
                if s.max_seconds is not None and self.stop_reason is None and led.has_work():
                    waits.append(max(0.0, s.max_seconds - now))
                if self.client is not None:     # look at the cluster's workers now and then
                    waits.append(WORKERS_POLL)
                timeout = min((w for w in waits if w is not None), default=None)
                for token, outcome in await backend.wait(timeout):
                    # not yet settled by the completion hook; after a failed booking nothing
                    # more is booked (the hook stops too): the run ends with that error
                    if token in inflight and not self.crashed:
                        if isinstance(outcome, ClusterCancelled):
                            self._cancelled_outside(token, outcome)
                        else:
                            self.settle(token, outcome)
                if self.crashed:
                    raise self.crashed[0]
                await self._expire()
                if self.crashed:
                    raise self.crashed[0]
                self._watch_workers()
                if bar is not None:         # update() redraws at most every 0.1 s
                    bar.update(books.outcomes, len(inflight), led.total_queued)
            if self.stop_reason is None:
                self.stop_reason = "queue_empty"
                rec.emit("stop", reason=self.stop_reason, in_flight=0)
                rec.commit()
            if self.side:                   # paper writers, within the run's deadline (then stopped below)
                if not all(fut.done() for fut in self.side):
                    await backend.release()  # the slots' threads, for the writers (actors)
                left = None if self.hard is None else max(0.0, self.hard - rec.now())
                await asyncio.wait(self.side, timeout=left)
            if self.ship:
                backend.ship(log_records(run.trace, shipped, run.run_id))
        finally:
            self.closing = True
            if bar is not None:             # 100 % of what was done, whatever stopped it
                bar.finish(books.outcomes, self.stop_reason)
            writing = [fut for fut in self.side if not fut.done()]
            for fut in writing:             # past the run's deadline, or the run failed: its paper writers
                fut.cancel()                # stop with it (one finishing later would write to a closed journal)
            if writing:
                await asyncio.wait(writing, timeout=1.0)
            await backend.close()
        return run.report(self.stop_reason, self.dispatched, cancelled=self.cancelled,
                          timed_out=self.timed_out)

    def _cancelled_outside(self, token: Any, why: ClusterCancelled) -> None:
        """An experiment whose future was cancelled on the cluster, not by this run (a lost
        scheduler, ``client.cancel``, ``client.restart``): it did not fail, so it is not
        counted (a lost scheduler used to fail every experiment in flight and prune every
        branch for "failures", for good: the journal kept the prunes). Like one cancelled at
        the run's deadline it gets a ``cancel`` event and is dispatched again first by the
        next run or a resume."""
        status = client_status(self.client)
        if status == "running":
            f = self.inflight[token]
            self.cancelled.append(f.h.id)
            self.carry.append(f.h)
            self.run.recorder.emit("cancel", f.h.branch, f.h.id, f.slot,
                                   reason=f"cancelled on the cluster, not by this run ({why.reason})")
            self.settle(token, CANCELLED)
            return
        # the client lost its scheduler: everything in flight is gone with it, and what the run
        # would submit now would never come back (it waited forever); it stops here
        lost = sorted(self.inflight.items(), key=lambda kv: kv[1].seq)
        for tok, f in lost:
            self.deadlines.discard(tok)
            self.cancelled.append(f.h.id)
            self.carry.append(f.h)
            self.run.recorder.emit("cancel", f.h.branch, f.h.id, f.slot,
                                   reason=f"the Dask client lost its scheduler ({why.reason})")
        self.inflight.clear()
        self.run.recorder.commit()
        raise ExperimentError(
            f"the Dask client lost its scheduler (client status {status!r}, {why.reason}); the "
            f"run stops, and the {len(lost)} experiment(s) in flight were not counted: they run "
            "again first in the next run() (with a client that is connected) or a resume")

    def _watch_workers(self) -> None:
        """Warn once when the cluster has had no worker for :data:`NO_WORKERS_WARN` seconds
        while experiments are in flight. Dask keeps them until a worker joins (an adaptive
        cluster scaled to zero gets one back), and so does the run: without this it waited
        without a word, forever where no worker ever comes back."""
        if self.client is None or not self.inflight:
            self._no_workers_since = None
            return
        try:
            threads = cluster_threads(self.client)
        except Exception:  # noqa: BLE001 - a client without the cached identity: no watch
            return
        now = self.run.recorder.now()
        if threads != 0:
            self._no_workers_since, self._no_workers_warned = None, False
            return
        if self._no_workers_since is None:
            self._no_workers_since = now
        if self._no_workers_warned or now - self._no_workers_since < NO_WORKERS_WARN:
            return
        self._no_workers_warned = True
        s = self.run.settings
        bounds = ", ".join(f"{k}={v:g}" for k, v in (("timeout", s.timeout),
                                                      ("max_seconds", s.max_seconds))
                           if v is not None) or "no timeout or max_seconds"
        warnings.warn(
            f"the cluster has had no workers for {now - self._no_workers_since:.0f} s; "
            f"{len(self.inflight)} experiment(s) in flight wait for a worker to join, and the run waits "
            f"with them ({bounds}); add workers, bound the run with timeout= or max_seconds=, "
            "or set distributed.scheduler.no-workers-timeout on the scheduler to fail them",
            RuntimeWarning, stacklevel=2)

    async def _expire(self) -> None:
        """Experiments past their timeout fail; past the run's deadline, all stop."""
        backend, inflight, rec = self.backend, self.inflight, self.run.recorder
        for token in self.deadlines.expired(rec.now()):
            if token in inflight:
                h = inflight[token].h
                await backend.cancel(token)
                if token not in inflight:       # it finished meanwhile after all
                    continue
                self.timed_out.append(h.id)
                timeout = self.run.settings.timeout
                what = (f"ran longer than timeout={timeout:g} s" if inflight[token].started else
                        "was queued behind another experiment in its slot and had not started "
                        f"timeout={timeout:g} s after that one ended (its worker may be frozen)")
                self.settle(token, ExperimentResult.failure(h, ExperimentTimeout(
                    f"{h.id!r} {what} and was cancelled (research.experiments.timeout)"), timeout))
        if self.hard is not None and inflight and rec.now() >= self.hard:
            s = self.run.settings
            # queued ones first (so none of them starts when a running one is cancelled),
            # each kept for the next run in dispatch order
            order = sorted(inflight, key=lambda t: (not inflight[t].waiting, inflight[t].seq))
            kept: list[tuple[int, Hypothesis]] = []
            for token in order:
                if token not in inflight:
                    continue
                if not isinstance(token, _Held):
                    await backend.cancel(token)
                if token not in inflight:       # it finished meanwhile after all
                    continue
                f = inflight[token]
                self.cancelled.append(f.h.id)
                kept.append((f.seq, f.h))
                rec.emit("cancel", f.h.branch, f.h.id, f.slot, reason=(
                    f"still running {s.cancel_grace:g} s after max_seconds="
                    f"{s.max_seconds:g}"))
                self.settle(token, CANCELLED)
            self.carry.extend(h for _, h in sorted(kept, key=lambda x: x[0]))
