"""The decision trace: every choice the scheduler makes is an :class:`Event`.

Kinds (``Event.kind``):

============== ==================================================================
``add``        hypotheses were queued (``data``: ``ids``)
``select``     a branch was chosen (``data``: ``score``; the branch scores at that
               moment: the best ``trace_scores`` of them, see below)
``dispatch``   a hypothesis started in ``slot`` (``data["ahead"]``: it was decided ahead and
               queued behind the experiment running in ``slot``; it starts when that
               one ends, see :mod:`.ahead`)
``result``     an experiment finished (``data``: ``reward``, ``duration``, ``mean``)
``failure``    an experiment raised or returned something unusable (``data``: ``error``)
``prune``      a branch was excluded (``data``: ``reason``, ``mean``, ``dropped`` ids)
``drop``       hypotheses added to an already pruned branch were not queued
``paper.trigger``  a branch's mean passed the paper threshold (once per branch)
``paper.done`` / ``paper.failed``  the paper writer finished for a branch
``expand``     the expander queued follow-ups (``data``: ``ids``)
``stop``       dispatching stopped (``data``: ``reason``); in-flight work drains after it
``finish``     with ``apply_order="dispatch"`` only: an experiment left its slot; its
               ``result``/``failure`` follows when every earlier dispatch is applied
``cancel``     an experiment still in flight when ``max_seconds`` plus the cancel grace
               passed was cancelled (``data``: ``reason``); it is not counted
============== ==================================================================

Events restored from a checkpoint carry ``data["restored"] = True`` (and no ``scores``).

Bounded scores: a ``select`` event keeps the scores of the best ``trace_scores`` branches
(``research.experiments.trace-scores``, default 32; the chosen branch always among them) in
``Event.top``, a small structured array of ``(branch index, score)``, best first, and
``Event.scored`` says how many branches were scored. With ``trace_scores="all"`` (or as many
as there are branches) ``Event.scores`` holds every branch's score in branch order instead. A
full score array costs 8 bytes per branch per decision: 100,000 decisions over 1,000 branches
kept 0.8 GB of scores. :meth:`Trace.scores` reads either form.

``Event.t`` is seconds since the run started (``time.perf_counter``); ``Trace.started_at`` is
the wall-clock (epoch) time of ``t = 0``. Slot occupancy is derived from ``dispatch`` and
``result``/``failure`` pairs, an experiment queued ahead counted from the end of the one
before it in its slot (:meth:`Trace.intervals`: :class:`SlotInterval` records, also
importable as ``Interval``, their name before they were renamed apart from
``dask_research.montecarlo.Interval``; :meth:`Trace.occupancy`).

Examples
--------
>>> from dask_research.experiments.decision_trace import Trace
>>> tr = Trace(slots=2)
>>> _ = tr.emit("dispatch", t=0.0, branch="a", hypothesis="h1", slot=0)
>>> _ = tr.emit("dispatch", t=0.0, branch="b", hypothesis="h2", slot=1)
>>> _ = tr.emit("result", t=1.0, branch="a", hypothesis="h1", slot=0, reward=0.5)
>>> _ = tr.emit("result", t=2.0, branch="b", hypothesis="h2", slot=1, reward=0.1)
>>> tr.occupancy(0.0, 2.0)          # slot 0 busy 1 s, slot 1 busy 2 s, of 2 x 2 s
0.75
>>> tr.occupancy()                  # nothing was ever queued (no ``queued`` recorded)
nan
>>> tr.max_concurrency()
2
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Event", "Trace", "SlotInterval", "Interval", "EVENT_KINDS", "top_scores"]

EVENT_KINDS = (
    "add", "select", "dispatch", "result", "failure", "prune", "revive", "drop",
    "paper.trigger", "paper.done", "paper.failed", "expand", "stop", "finish", "cancel",
)
_ENDS = ("result", "failure", "finish", "cancel")     # kinds that free an experiment's slot


def _jsonable(x: Any) -> Any:
    """Floats that JSON cannot hold become strings ("inf", "nan"); numpy scalars become Python."""
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    return repr(x)


TOP_DTYPE = np.dtype([("branch", "<i4"), ("score", "<f8")])


def top_scores(scores: np.ndarray, k: int, chosen: int) -> np.ndarray:
    """The best ``k`` of ``scores`` as a :data:`TOP_DTYPE` array, best first (equal scores:
    lower branch index first; which of several equal scores at the cut are kept is
    deterministic but unspecified), always including branch ``chosen``.

    >>> top_scores(np.array([0.1, 0.9, 0.5, 0.9]), 2, 0).tolist()
    [(1, 0.9), (0, 0.1)]
    """
    n = len(scores)
    if k < n:                                   # O(branches): no full sort per decision
        idx = np.argpartition(scores, n - k)[n - k:]
        idx.sort()
        if chosen not in idx:
            idx = idx[np.argsort(-scores[idx], kind="stable")]
            idx[-1] = chosen
            idx.sort()
    else:
        idx = np.arange(n)
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    out = np.empty(len(idx), dtype=TOP_DTYPE)
    out["branch"] = idx
    out["score"] = scores[idx]
    return out


@dataclass(slots=True)
class Event:
    """One decision. On ``select`` events, ``scores`` (every branch's, branch order) or ``top``
    (the best few, see the module docstring) and ``scored`` (branches scored)."""

    seq: int
    t: float
    kind: str
    branch: str | None = None
    hypothesis: str | None = None
    slot: int | None = None
    data: dict[str, Any] = field(default_factory=dict)
    scores: np.ndarray | None = None
    top: np.ndarray | None = None
    scored: int = 0

    def to_dict(self, branches: Sequence[str] | None = None) -> dict[str, Any]:
        """Plain, JSON-ready dict; ``branches`` names the entries of ``scores``."""
        d: dict[str, Any] = {"seq": self.seq, "t": round(self.t, 9), "kind": self.kind}
        for key in ("branch", "hypothesis", "slot"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.data:
            d.update(_jsonable(self.data))
        if self.scores is not None:
            names = branches if branches is not None else range(len(self.scores))
            d["scores"] = {str(b): _jsonable(s) for b, s in zip(names, self.scores.tolist())}
        elif self.top is not None:
            d["scores"] = {str(branches[i] if branches is not None else i): _jsonable(s)
                           for i, s in self.top.tolist()}
            d["scores_truncated"] = self.scored
        return d


class SlotInterval(NamedTuple):
    """One experiment's stay in a slot, from dispatch to result (or failure).

    >>> SlotInterval(0, 0.0, 1.5, "h1", "a").end
    1.5
    """

    slot: int
    start: float
    end: float
    hypothesis: str
    branch: str


Interval = SlotInterval
"""The name of :class:`SlotInterval` before it was renamed (it collided with
``dask_research.montecarlo.Interval``); kept so existing code keeps working."""


class Trace(Sequence[Event]):
    """Ordered list of :class:`Event` with helpers to read it.

    Parameters
    ----------
    slots : int
        Number of experiment slots (for occupancy).
    branches : list of str, optional
        Branch names in insertion order; select events' ``scores`` follow this order. The
        scheduler passes its own (growing) list.
    """

    def __init__(self, slots: int = 1, branches: list[str] | None = None, started_at: float = 0.0):
        self.slots = slots
        self.branches: list[str] = branches if branches is not None else []
        self.started_at = started_at
        self._events: list[Event] = []

    # -- recording ----------------------------------------------------------------------
    def emit(
        self,
        kind: str,
        t: float,
        branch: str | None = None,
        hypothesis: str | None = None,
        slot: int | None = None,
        scores: np.ndarray | None = None,
        **data: Any,
    ) -> Event:
        """Append an event and return it."""
        ev = Event(len(self._events), t, kind, branch, hypothesis, slot, data, scores)
        self._events.append(ev)
        return ev

    # -- Sequence -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i):
        return self._events[i]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for ev in self._events:
            counts[ev.kind] = counts.get(ev.kind, 0) + 1
        inner = ", ".join(f"{k}={v}" for k, v in counts.items())
        return f"<Trace {len(self)} events: {inner}>"

    # -- reading ------------------------------------------------------------------------
    def of(self, *kinds: str) -> list[Event]:
        """Events of the given kinds, in order.

        >>> Trace().of("select")
        []
        """
        return [ev for ev in self._events if ev.kind in kinds]

    def picks(self) -> list[str]:
        """Branches in the order they were selected."""
        return [ev.branch for ev in self._events if ev.kind == "select"]  # type: ignore[misc]

    def scores(self, event: Event) -> dict[str, float]:
        """``{branch: score}`` of a ``select`` event: every branch, or the best
        ``trace_scores`` of them, best first, when the trace is bounded."""
        if event.top is not None:
            return {self.branches[i]: s for i, s in event.top.tolist()}
        if event.scores is None:
            raise ValueError(f"event {event.seq} ({event.kind}) carries no scores")
        return dict(zip(self.branches, event.scores.tolist()))

    def _runs(self) -> Iterator[tuple[Event, str, Event, float]]:
        """``(event, what, dispatch, t)`` for every dispatch and end event in order: ``what``
        is ``"start"`` (at ``t``), ``"end"`` (of a started experiment) or ``"wait"`` (an
        ahead dispatch, queued behind its slot's experiment); an ahead experiment starts when
        the one before it in its slot ends (a second ``"start"`` at that end event)."""
        open_: dict[str, Event] = {}
        running: dict[int, str] = {}                      # slot -> hypothesis running there
        lanes: dict[int, list[str]] = {}                  # slot -> ahead hypotheses, in order
        for ev in self._events:
            if ev.kind == "dispatch":
                hid = str(ev.hypothesis)
                old = open_.get(hid)                      # a re-dispatch after a crash: the
                if old is not None:                       # first one left its slot then
                    was = int(old.slot or 0)
                    if running.get(was) == hid:
                        del running[was]
                    if hid in lanes.get(was, ()):
                        lanes[was].remove(hid)
                open_[hid] = ev
                slot = int(ev.slot or 0)
                if ev.data.get("ahead") and slot in running:
                    lanes.setdefault(slot, []).append(hid)
                    yield ev, "wait", ev, ev.t
                else:
                    running[slot] = hid
                    yield ev, "start", ev, ev.t
            elif ev.kind in _ENDS and ev.hypothesis in open_:
                hid = str(ev.hypothesis)
                d = open_.pop(hid)
                slot = int(d.slot or 0)
                lane = lanes.get(slot, [])
                if hid in lane:                           # done before its slot freed: it
                    lane.remove(hid)                      # found a free thread of its own
                    yield ev, "end", d, ev.t
                    continue
                yield ev, "end", d, ev.t
                if running.get(slot) == hid:
                    del running[slot]
                    if lane:
                        nxt = lane.pop(0)
                        running[slot] = nxt
                        yield ev, "start", open_[nxt], ev.t

    def intervals(self) -> list[SlotInterval]:
        """Each experiment's (slot, start time, end time); unfinished ones are left out. An
        experiment starts at its dispatch, or, queued ahead, when the experiment before it in
        its slot ended (one that finished before that ran on a free thread of its own: from
        its end less its duration)."""
        started: dict[str, float] = {}
        out = []
        for ev, what, d, t in self._runs():
            hid = str(d.hypothesis)
            if what == "start":
                started[hid] = t
            elif what == "end":
                start = started.pop(hid, None)
                if start is None:                         # never started in its slot
                    duration = ev.data.get("duration")
                    start = (max(d.t, t - float(duration)) if isinstance(duration, (int, float))
                             and math.isfinite(duration) else t)
                out.append(SlotInterval(int(d.slot or 0), start, t, hid, str(d.branch)))
        return out

    def busy_window(self) -> tuple[float, float]:
        """``(first dispatch, last dispatch)``: the time during which work was queued."""
        ts = [ev.t for ev in self._events if ev.kind == "dispatch"]
        return (ts[0], ts[-1]) if ts else (0.0, 0.0)

    def occupancy(self, start: float | None = None, end: float | None = None) -> float:
        """Fraction of slot-seconds busy.

        Without arguments: **while work was queued**, i.e. integrated over the periods in which
        at least one hypothesis was waiting (every event records ``queued``, the number waiting
        after it). An ideal scheduler scores 1.0 there; the gap between a result and the next
        dispatch is what it loses. With ``start``/``end``: over that window, whatever was queued
        (``nan`` for an empty window or when nothing was ever queued).
        """
        if start is None and end is None:
            return self._queued_occupancy()
        s0, e0 = self.busy_window()
        start = s0 if start is None else start
        end = e0 if end is None else end
        if end <= start:
            return math.nan
        busy = 0.0
        for iv in self.intervals():
            busy += max(0.0, min(iv.end, end) - max(iv.start, start))
        return busy / (self.slots * (end - start))

    def _queued_occupancy(self) -> float:
        queued = 0
        running: set[str] = set()
        last = None
        num = den = 0.0
        runs = self._runs()
        pending = next(runs, None)
        for ev in self._events:
            if last is not None and queued > 0:
                dt = ev.t - last
                num += min(len(running), self.slots) * dt
                den += self.slots * dt
            last = ev.t
            while pending is not None and pending[0] is ev:     # this event's starts and ends
                _, what, d, _t = pending
                if what == "start":
                    running.add(str(d.hypothesis))
                elif what == "end":
                    running.discard(str(d.hypothesis))   # restored results never had a slot here
                pending = next(runs, None)
            queued = ev.data.get("queued", queued)
        return num / den if den > 0 else math.nan

    def concurrency(self) -> list[tuple[float, int]]:
        """Step function ``[(t, experiments running after t), ...]`` (an experiment queued
        ahead runs from the end of the one before it in its slot)."""
        steps: list[tuple[float, int]] = []
        running: set[str] = set()
        for _, what, d, t in self._runs():
            if what == "start":
                running.add(str(d.hypothesis))  # a re-dispatch after a crash is not a second one
            elif what == "end":
                running.discard(str(d.hypothesis))
            else:
                continue
            steps.append((t, len(running)))
        return steps

    def max_concurrency(self) -> int:
        """Largest number of experiments in flight at once."""
        return max((level for _, level in self.concurrency()), default=0)

    def to_records(self) -> list[dict[str, Any]]:
        """All events as plain dicts (scores named by branch)."""
        return [ev.to_dict(self.branches) for ev in self._events]
