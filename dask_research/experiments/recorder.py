"""The recorder: every decision becomes an :class:`~.decision_trace.Event` in the trace, and a journal
record when the scheduler has a checkpoint; :func:`log_records` shapes events for the Dask log.

The clock of a run starts at :meth:`Recorder.begin` (a resumed run continues the clock of the
journaled one), so event times are seconds since the start of the whole run.

Examples
--------
>>> from dask_research.experiments import Hypothesis
>>> from dask_research.experiments.ledger import BranchLedger
>>> from dask_research.experiments.recorder import Recorder, log_records
>>> led = BranchLedger(c=1.0)
>>> _ = led.add([Hypothesis("a1", "a")])
>>> rec = Recorder(slots=1, trace_scores=None, ledger=led)
>>> trace = rec.begin([], 0.0)
>>> rec.emit("dispatch", "a", "a1", 0)
>>> [(e.kind, e.data["queued"]) for e in trace]
[('dispatch', 1)]
>>> log_records(trace, 0, "run1")[0]["event"]
'dispatch'
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..exceptions import ExperimentError
from .checkpoint import Journal
from .decision_trace import Event, Trace, _jsonable, top_scores
from .ledger import BranchLedger

__all__ = ["Recorder", "log_records"]

LOG_TOP_SCORES = 32    # select events in the Dask event log carry the best 32 scores


class Recorder:
    """Trace, clock and journal of one scheduler.

    Parameters
    ----------
    slots : int
        Slots of the run (for the trace's occupancy figures).
    trace_scores : int or None
        ``select`` events keep the best this many scores (``None``: every branch's).
    ledger : BranchLedger
        Its branch list names the scores; its queue length goes into every event.
    journal : Journal, optional
        Where every event is appended (see :mod:`.checkpoint`).
    header : callable, optional
        The settings the journal's header records (read when the journal is opened).
    """

    def __init__(self, slots: int, trace_scores: int | None, ledger: BranchLedger,
                 journal: Journal | None = None,
                 header: Callable[[], dict[str, Any]] | None = None) -> None:
        self.slots = slots
        self.trace_scores = trace_scores
        self.ledger = ledger
        self.journal = journal
        self._header = header or dict
        self.trace: Trace | None = None
        self._t0: float | None = None       # time.perf_counter() at the run's start; None: not begun
        self.lost_step: str | None = None   # why a step was dropped unwritten (see discard)

    def begin(self, events: list[Event], elapsed: float) -> Trace:
        """A new trace holding ``events`` (restored ones); the clock starts at ``elapsed``."""
        self._t0 = time.perf_counter() - elapsed
        self.trace = Trace(self.slots, self.ledger.branches, started_at=time.time())
        self.trace._events.extend(events)
        return self.trace

    def now(self) -> float:
        """Seconds since the run started (0.0 before :meth:`begin`: the run has not started)."""
        t0 = self._t0
        return 0.0 if t0 is None else time.perf_counter() - t0

    def emit(self, kind: str, branch: str | None = None, hypothesis: str | None = None,
             slot: int | None = None, scores: Any = None, journal: dict | None = None,
             chosen: int = 0, **data: Any) -> None:
        """Record one event (``journal``: fields for the journal record only)."""
        trace = self.trace
        assert trace is not None
        data["queued"] = self.ledger.n_queued
        ev = Event(len(trace._events), self.now(), kind, branch,
                   hypothesis, slot, data, scores)
        if scores is not None:
            ev.scored = len(scores)
            k = self.trace_scores
            if k is not None and k < len(scores):     # bounded: the best k, not every branch
                ev.scores, ev.top = None, top_scores(scores, k, chosen)
        trace._events.append(ev)
        if self.journal is not None:
            rec: dict[str, Any] = {"seq": ev.seq, "t": ev.t, "kind": kind}
            for key, value in (("branch", branch), ("hypothesis", hypothesis), ("slot", slot)):
                if value is not None:
                    rec[key] = value
            rec.update(data)
            if journal:
                rec.update(journal)
            try:
                self.write({"kind": "event", "e": rec})
            except BaseException as exc:
                self._lose(exc)             # the event is in memory, not in the journal
                raise

    def write(self, rec: dict[str, Any]) -> None:
        """Stage ``rec`` in the journal's current step (the journal is opened with the settings
        header on first use); :meth:`commit` writes the step."""
        journal = self.journal
        assert journal is not None
        journal.open(self._header())
        journal.stage(rec)

    def commit(self) -> None:
        """End the current step: its journal records are written together, or not at all
        (see :mod:`.checkpoint`). Called before the loop acts on a decision: before an
        experiment starts, before ``ask``, ``tell`` or ``add`` returns, when a run ends."""
        if self.journal is not None:
            try:
                self.journal.commit()
            except BaseException as exc:
                self._lose(exc)             # the step is in memory, not in the journal
                raise

    def _lose(self, why: BaseException) -> None:
        """A step made in memory could not be written (a record its readers would refuse, a
        full disk, a journal taken over): it is dropped, and the scheduler goes no further
        (:meth:`check_whole`)."""
        assert self.journal is not None
        self.journal.discard()
        if self.lost_step is None:
            self.lost_step = f"{type(why).__name__}: {why}"

    def discard(self, why: BaseException) -> None:
        """Drop the current step unwritten: ``why`` cut it short (see :meth:`Journal.discard`).
        The scheduler's memory is then ahead of its journal, so it goes no further
        (:meth:`check_whole`): its journal, resumed, is where it goes on."""
        if self.journal is not None and self.journal.discard():
            self.lost_step = f"{type(why).__name__}: {why}"

    def check_whole(self) -> None:
        """Raise :class:`ExperimentError` if a step was dropped unwritten (:meth:`discard`)."""
        if self.lost_step is not None:
            assert self.journal is not None
            raise ExperimentError(
                f"this scheduler could not write a step to its checkpoint {self.journal.url} "
                f"({self.lost_step[:300]}), so what it holds in memory is ahead of the checkpoint; "
                "go on from the checkpoint: IterationScheduler.resume(path, runner)")


def log_records(trace: Trace, start: int, run_id: str) -> list[dict]:
    """Events ``trace[start:]`` as Dask log records in the project's vocabulary
    (``{"event": kind, "run": run_id, ...}``); select records keep the best 32 scores."""
    out = []
    for ev in trace[start:]:
        scores, top = ev.scores, ev.top
        if scores is not None and len(scores) > LOG_TOP_SCORES:
            top = top_scores(scores, LOG_TOP_SCORES,
                             trace.branches.index(ev.branch) if ev.branch else 0)
        if top is not None:
            kept = ev.top
            ev.scores = ev.top = None
            d = ev.to_dict()
            ev.scores, ev.top = scores, kept
            d["scores"] = {trace.branches[j]: _jsonable(s)
                           for j, s in top[:LOG_TOP_SCORES].tolist()}
            d["scores_truncated"] = ev.scored
        else:
            d = ev.to_dict(trace.branches)
        d["event"] = d.pop("kind")
        d["run"] = run_id
        out.append(d)
    return out
