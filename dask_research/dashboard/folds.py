"""The folds of the research events: what each page shows, built one event at a time.

A fold takes one event at a time (``feed``, which returns why it skipped an event it cannot
read, else ``None``) and holds, within fixed bounds, what its page draws: :class:`ShardFold`
(the Shards page), :class:`BranchFold` (Branches) and :class:`PlaneFold` (Experience). The
scheduler plugin (:mod:`.plugin`) feeds them as events are logged; a page without the plugin
feeds its own from the log (:mod:`.components`). Nothing here draws or imports bokeh.

Examples
--------
>>> fold = ShardFold()
>>> feed_event(fold, {"event": "start", "run": "r", "shards": 4, "key_prefix": "p"}, "Shards")
>>> feed_event(fold, {"event": "accepted", "run": "r", "start": 0, "stop": 3}, "Shards")
>>> fold.cells.shard_counts()["accepted"]
3
"""
from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from typing import Any

import numpy as np

from ..events import unpack
from .shard_cells import ShardCells, check_start

logger = logging.getLogger(__name__)

__all__ = ["ShardFold", "BranchFold", "PlaneFold", "feed_event", "skip_bad_event", "branch_view",
           "plane_series", "short_text", "all_hashable"]

def skip_bad_event(page: str, msg: Any, reason: str) -> None:
    """One warning for an event a page cannot read (a buggy producer, another client's version)."""
    logger.warning("research %s page: skipped an event it cannot read (%s): %.200r", page, reason, msg)


def feed_event(fold: Any, msg: dict, page: str) -> None:
    """Give one event to ``fold.feed``; an event it refuses (it returns why), or one it fails on,
    is skipped with one warning naming ``page`` (:func:`skip_bad_event`), never raised."""
    try:
        reason = fold.feed(msg)
    except Exception as e:  # noqa: BLE001 - a fold's bug must cost one event, not the page or the scheduler
        reason = f"{type(e).__name__}: {short_text(e)}"
    if reason is not None:
        skip_bad_event(page, msg, reason)


def short_text(value: Any, limit: int = 200) -> str:
    """``str(value)`` cut to ``limit`` characters (a page shows names, never a whole essay).

    >>> short_text("x" * 300, 10)
    'xxxxxxxxx…'
    """
    text = str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _estimate(msg: dict) -> dict | None:
    """The running estimate of an ``accepted`` event as numbers, or ``None`` where it has none."""
    try:
        return {"mean": float(msg["mean"]), "stderr": float(msg["stderr"]), "n": int(msg["n"])}
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


class ShardFold:
    """What the Shards page shows of the latest Monte-Carlo run, folded in one event at a time.

    A valid ``start`` replaces the run held: the fold holds one run, its :class:`ShardCells`
    (4,096 cells at most), its latest running estimate and its last :attr:`MAX_ENDS` ``done`` /
    ``failed`` events, however many runs come and go. Events of other runs are ignored. An
    event costs the cells it touches, never the run's shards (issue 28: a 10^7-shard run cost
    1.5 s of the scheduler's event loop per update). :meth:`feed` checks the fields it reads and
    returns why it skipped an event (a bad ``start`` is no run; a bad ``accepted`` range changes
    nothing; an ``accepted`` whose estimate is not numbers counts its shards but keeps the
    estimate it had).

    >>> fold = ShardFold()
    >>> fold.feed({"event": "start", "run": "r", "shards": 4, "key_prefix": "p"})
    >>> fold.feed({"event": "accepted", "run": "r", "start": 0, "stop": 3, "mean": 0.5, "stderr": 0.1, "n": 30})
    >>> fold.feed({"event": "accepted", "run": "r", "start": 3, "stop": 9})
    "shards [3, 9) are not a range within the run's 4 shards"
    >>> fold.cells.shard_counts()["accepted"], fold.estimate["mean"], fold.fed
    (3, 0.5, 3)
    """

    #: ``done`` / ``failed`` events kept of the run held (the last one says what became of it).
    MAX_ENDS = 8

    def __init__(self) -> None:
        self.start: dict | None = None           # the run's start event
        self.cells: ShardCells | None = None
        self.ends: deque = deque(maxlen=self.MAX_ENDS)
        self.estimate: dict | None = None        # mean, stderr, n of the latest accepted event with them
        self.missed = False                      # whether the log dropped events of the run unread
        self.fed = 0                             # events given to feed, ever

    def feed(self, msg: dict) -> str | None:
        """Fold one event in; why it was skipped, or ``None`` (also for another run's events)."""
        self.fed += 1
        kind = msg.get("event")
        if kind == "start":
            reason = check_start(msg)
            if reason is not None:
                return reason
            self.start, self.cells, self.estimate, self.missed = msg, ShardCells(int(msg["shards"])), None, False
            self.ends = deque(maxlen=self.MAX_ENDS)
            return None
        if self.cells is None or self.start is None or msg.get("run") != self.start["run"]:
            return None
        if kind in ("done", "failed"):
            self.ends.append(msg)
            return None
        try:
            self.cells.apply(msg)
        except ValueError as e:
            return str(e)
        if kind == "accepted" and msg.get("mean") is not None:
            estimate = _estimate(msg)
            if estimate is None:
                return "mean, stderr and n are not numbers"
            self.estimate = estimate
        return None

    def log_wrapped(self) -> None:
        """The page's log cursor lost its place (the log dropped events unread): the run held
        misses some (a new ``start`` clears it)."""
        if self.start is not None:
            self.missed = True


_STATS_NUMBERS = ("t", "size", "inserted", "sampled", "exposed_mean_s")
#: The most tiers a plane has (a stats event with more is not drawn).
_MAX_TIERS = 64


def _finite(v: Any) -> bool:
    """A real number (not a bool) within float's range, neither NaN nor infinite."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:            # an int past float's range
        return False


def _bad_stats(m: dict) -> str | None:
    """Why a replay ``stats`` event cannot be drawn (``None`` if it can).

    >>> _bad_stats({"t": 1.0, "size": "x", "inserted": 0, "sampled": 0, "exposed_mean_s": 0.0})
    "size 'x' is not a finite number"
    >>> _bad_stats({"t": 1.0, "size": 3, "capacity": 8, "inserted": 3, "sampled": 0, "exposed_mean_s": 0.0,
    ...             "tiers": ({"name": "host", "rows": 8, "used": 3},)}) is None     # as a comm delivers it
    True
    """
    for key in _STATS_NUMBERS:
        v = m.get(key)
        if not _finite(v):
            return f"{key} {v!r} is not a finite number"
    step = m.get("step_mean_s")
    if step is not None and not _finite(step):
        return f"step_mean_s {step!r} is not a finite number"
    tiers = m.get("tiers", [])
    # a list as published; a tuple once it crossed a Dask comm (msgpack decodes arrays as tuples)
    if not isinstance(tiers, (list, tuple)) or len(tiers) > _MAX_TIERS or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and _finite(t.get("rows"))
            and _finite(t.get("used")) and isinstance(t["rows"], (int, np.integer))
            and isinstance(t["used"], (int, np.integer)) for t in tiers):
        return "tiers is not a list of {name, rows, used}"
    if len({t["name"] for t in tiers}) < len(tiers):
        return "two tiers have the same name"
    return None


class PlaneFold:
    """The Experience page's series, per plane, folded in one ``stats`` event at a time.

    An event costs a few appends, so a page update costs the events logged since the last one
    (it re-read the whole log every second: about 100 ms per update with the 1,000 entries the
    scheduler keeps). Each series keeps its last :attr:`MAX_POINTS` points, and at most
    :attr:`MAX_PLANES` planes are followed (the ones that published last).
    """

    #: Points kept per series (the latest ones).
    MAX_POINTS = 2000
    #: Planes followed; past that the one that published least recently is forgotten.
    MAX_PLANES = 64
    COLUMNS = ("t", "size", "ingest_rate", "sample_rate", "exposed_ms", "exposed_pct")

    def __init__(self) -> None:
        self.series: dict[str, dict[str, Any]] = {}
        self.recent: dict[str, list[dict]] = {}            # the plane's last few events: rate bases
        self.total: dict[str, int] = {}                    # points ever added, per plane
        self.latest: str | None = None                     # the plane that published last
        self.fed = 0                                       # events given to feed, ever

    def feed(self, m: dict) -> str | None:
        """Fold one event in; why it was skipped, or ``None`` (also for an event of another kind)."""
        self.fed += 1
        if m.get("event") != "stats":
            return None
        reason = _bad_stats(m)
        if reason is not None:
            return reason
        name = short_text(m.get("plane", "plane"), 200)
        if name not in self.series:
            if len(self.series) >= self.MAX_PLANES:
                oldest = min(self.series, key=lambda k: self.series[k]["t"][-1])
                for d in (self.series, self.recent, self.total):
                    d.pop(oldest, None)
            self.series[name] = {k: deque(maxlen=self.MAX_POINTS) for k in self.COLUMNS}
            self.series[name]["tiers"] = []
            self.total[name] = 0
        s = self.series[name]
        t = float(m["t"])
        prev = _rate_base(self.recent.setdefault(name, []), t)
        dt = (t - prev["t"]) if prev else 0.0
        s["t"].append(t * 1000.0)
        s["size"].append(float(m["size"]))
        # a cluster plane's count drops when a shard is lost: a rate is never negative
        s["ingest_rate"].append(max(0.0, (float(m["inserted"]) - prev["inserted"]) / dt) if prev and dt > 0 else 0.0)
        s["sample_rate"].append(max(0.0, (float(m["sampled"]) - prev["sampled"]) / dt) if prev and dt > 0 else 0.0)
        exposed = float(m["exposed_mean_s"])
        s["exposed_ms"].append(exposed * 1e3)
        step = float(m.get("step_mean_s") or 0.0)
        s["exposed_pct"].append(100.0 * exposed / step if step > 0 else 0.0)
        s["tiers"] = [{"name": x["name"], "rows": float(x["rows"]), "used": float(x["used"])}
                      for x in m.get("tiers", [])]
        base = {"t": t, "inserted": float(m["inserted"]), "sampled": float(m["sampled"])}
        self.recent[name] = (self.recent[name] + [base])[-8:]
        self.total[name] += 1
        if self.latest is None or self.latest not in self.series or t * 1000.0 >= self.series[self.latest]["t"][-1]:
            self.latest = name
        return None


def plane_series(events: list) -> dict[str, dict[str, list]]:
    """Per plane: time series of size, ingest and sample rates, exposed latency (from ``stats``).

    A rate is taken over at least half the plane's usual publishing interval: the last event of
    a run comes a few milliseconds after the one before (published when the plane closes), and
    255 transitions in 18 ms drew an ingest spike of 14,000/s over a run of 500/s. Malformed
    events are skipped with a warning each (see :class:`PlaneFold`).

    >>> ev = [(i, {"event": "stats", "plane": "p", "t": t, "size": n, "capacity": 10**6, "inserted": n,
    ...            "sampled": 0, "tiers": [], "exposed_mean_s": 0.0})
    ...       for i, (t, n) in enumerate([(0.0, 0), (1.0, 500), (2.0, 1000), (3.0, 1500), (3.018, 1509)])]
    >>> [round(r) for r in plane_series(ev)["p"]["ingest_rate"]]
    [0, 500, 500, 500, 500]
    """
    fold = PlaneFold()
    for _, m in unpack(events):
        reason = fold.feed(m)
        if reason is not None:
            skip_bad_event("Experience", m, reason)
    return {name: {k: (v if k == "tiers" else list(v)) for k, v in s.items()} for name, s in fold.series.items()}


def _rate_base(recent: list[dict], t: float) -> dict | None:
    """The latest of ``recent`` at least half the usual interval between them before ``t``."""
    if not recent:
        return None
    gaps = sorted(b["t"] - a["t"] for a, b in zip(recent, recent[1:]) if b["t"] > a["t"])
    usual = gaps[len(gaps) // 2] if gaps else 0.0
    return next((m for m in reversed(recent) if t - m["t"] >= usual / 2), recent[-1])


def _num(x: Any) -> float:
    """``float(x)``, or NaN for what is not a number (a string, None, an int past float's range).

    >>> _num("inf"), _num(None), _num(10**400)
    (inf, nan, nan)
    """
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def all_hashable(*values: Any) -> bool:
    try:
        hash(values)
    except TypeError:
        return False
    return True


#: Events of the Branches page that name a branch.
_BRANCH_KINDS = ("dispatch", "prune", "paper.trigger")


class BranchFold:
    """What the Branches page shows of the latest experiments run, folded in one event at a time.

    An event costs a few dictionary operations, so a page update costs the events logged since
    the last one, never the run's length (it re-read the whole log on every update: 3 s of the
    scheduler's event loop per update with 300,000 events in the log). A score line keeps its
    last :attr:`MAX_POINTS` points and the slot-use series its last :attr:`MAX_OCCUPANCY`. The
    fold holds one run: an ``add`` of another run replaces it, so what it keeps is one run's
    however many runs come and go.

    Events come from any client of the scheduler: :meth:`feed` checks the fields it reads and
    skips an event it cannot read (returning why), leaving the state as it was.
    """

    #: Points kept per score line (the latest ones).
    MAX_POINTS = 1000
    #: Points kept of the slot-use series (the latest ones).
    MAX_OCCUPANCY = 5000

    def __init__(self, max_lines: int = 10) -> None:
        self.max_lines = max_lines
        self.run: Any = None
        self.started = False
        self.epoch = 0                       # a new run: a new epoch (the page redraws all)
        self.fed = 0                         # events given to feed, ever
        self._reset(None)

    def _reset(self, run: Any) -> None:
        self.run = run
        self.epoch += 1
        self.branches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.scores: dict[str, tuple[deque, deque]] = {}
        self.measured: set[str] = set()                  # branches with a result so far
        self.busy_t: deque = deque([0.0], maxlen=self.MAX_OCCUPANCY)
        self.busy_n: deque = deque([0], maxlen=self.MAX_OCCUPANCY)
        self.ahead_n: deque = deque([0], maxlen=self.MAX_OCCUPANCY)
        self.occupancy_total = 1                         # points ever added to the series
        self.holder: dict[Any, Any] = {}                 # slot -> the experiment running there
        self.lanes: dict[Any, list] = {}                 # slot -> experiments queued ahead behind it
        self.slot_of: dict[Any, Any] = {}                # experiment -> its slot, until it ends
        self.stop: Any = None
        self.results = 0
        self.pruned: set[str] = set()
        self.papers: list[str] = []

    def _occupancy(self, t: float) -> None:
        self.busy_t.append(t)
        self.busy_n.append(len(self.holder))
        self.ahead_n.append(sum(map(len, self.lanes.values())))
        self.occupancy_total += 1

    def feed(self, r: dict) -> str | None:
        """Fold one event in; why it was skipped, or ``None`` (also for another run's events)."""
        self.fed += 1
        kind, run = r.get("event"), r.get("run")
        if kind == "add" and run is not None and (not self.started or run != self.run):
            self._reset(run)
            self.started = True
        if not self.started or run != self.run:
            return None
        b: Any = r.get("branch")
        if b is not None and not isinstance(b, str):
            return f"branch {b!r} is not a name"
        if b is None and kind in _BRANCH_KINDS:
            return "it names no branch"
        t = _num(r.get("t"))
        if kind == "select":
            scores = r.get("scores") or {}
            if not isinstance(scores, dict):
                return f"scores {scores!r} is not a mapping of branch to score"
            for name, v in scores.items():
                if isinstance(name, str) and name in self.measured:
                    line = self.scores.get(name)
                    if line is None:
                        line = self.scores[name] = (deque(maxlen=self.MAX_POINTS), deque(maxlen=self.MAX_POINTS))
                    line[0].append(t)
                    line[1].append(_num(v))
            return None
        if kind == "dispatch":
            h = r.get("hypothesis", ("dispatch", r.get("seq"), t))
            slot = r.get("slot", ("own", h))
            if not all_hashable(h, slot):
                return "its hypothesis or slot is not an id"
        elif kind in ("result", "failure", "finish", "cancel"):
            h = r.get("hypothesis")
            if not all_hashable(h):
                return "its hypothesis is not an id"
        if b is not None and b not in self.branches:
            self.branches[b] = {"runs": 0, "pending": 0, "mean": math.nan, "pruned": False, "paper": False}
            self.order.append(b)
        if kind == "dispatch":
            if h in self.slot_of:                   # a re-dispatch: the first one left its slot
                _leave(h, self.holder, self.lanes, self.slot_of)
            else:
                self.branches[b]["pending"] += 1
            self.slot_of[h] = slot
            if r.get("ahead") and slot in self.holder:
                self.lanes.setdefault(slot, []).append(h)
            else:
                self.holder[slot] = h
            self._occupancy(t)
        elif kind in ("result", "failure", "finish", "cancel"):
            if kind in ("result", "failure") and b in self.branches:
                br = self.branches[b]
                br["pending"] = max(0, br["pending"] - 1)
                if kind == "result":
                    br["runs"] += 1
                    br["mean"] = _num(r.get("mean"))
                    self.measured.add(b)
                    self.results += 1
            if h in self.slot_of:
                _leave(h, self.holder, self.lanes, self.slot_of)
            elif h is None and self.holder:         # an old log without hypothesis ids
                self.holder.pop(next(iter(self.holder)))
            self._occupancy(t)
        elif kind == "prune":
            if not self.branches[b]["pruned"]:
                self.branches[b]["pruned"] = True
                self.pruned.add(b)
        elif kind == "paper.trigger":
            if not self.branches[b]["paper"]:
                self.branches[b]["paper"] = True
                self.papers.append(b)
        elif kind == "stop":
            self.stop = r.get("reason")
        return None

    def top(self) -> list[str]:
        """The busiest branches with a score line, at most ``max_lines``."""
        return [k for k in heapq.nlargest(self.max_lines, (k for k in self.order if k in self.scores),
                                          key=lambda name: self.branches[name]["runs"])]

    def view(self) -> dict[str, Any] | None:
        if not self.started:
            return None
        return {"run": self.run, "branches": self.branches, "order": self.order,
                "scores": {k: (list(self.scores[k][0]), list(self.scores[k][1])) for k in self.top()},
                "occupancy": (list(self.busy_t), list(self.busy_n), list(self.ahead_n)), "stop": self.stop}


def branch_view(events: list, max_lines: int = 10) -> dict[str, Any] | None:
    """Per-branch state, score lines and slot use of the latest experiments run (:class:`BranchFold`).

    A branch's score line starts at its first result (before it, its score is the bonus over no
    data: infinite, or a guess) and its points are the selections, drawn as steps. Slot use
    counts the experiments that hold a slot, and apart from them those queued ahead behind a
    slot's running experiment (a dispatch with ``ahead``, which starts when that one ends),
    so three slots never read as six experiments running. Malformed events are skipped with a
    warning each.

    >>> ev = [(0, {"event": "add", "run": "r"}),
    ...       (1, {"event": "select", "run": "r", "t": 0.1, "scores": {"a": "inf"}}),
    ...       (2, {"event": "dispatch", "run": "r", "t": 0.1, "branch": "a", "hypothesis": "a0", "slot": 0}),
    ...       (3, {"event": "dispatch", "run": "r", "t": 0.2, "branch": "a", "hypothesis": "a1", "slot": 0,
    ...            "ahead": True}),
    ...       (4, {"event": "result", "run": "r", "t": 0.3, "branch": "a", "hypothesis": "a0", "mean": 0.5}),
    ...       (5, {"event": "select", "run": "r", "t": 0.3, "scores": {"a": 1.5}})]
    >>> view = branch_view(ev)
    >>> view["scores"], view["occupancy"]
    ({'a': ([0.3], [1.5])}, ([0.0, 0.1, 0.2, 0.3], [0, 1, 1, 1], [0, 0, 1, 0]))
    """
    fold = BranchFold(max_lines)
    for _, r in unpack(events):
        reason = fold.feed(r)
        if reason is not None:
            skip_bad_event("Branches", r, reason)
    return fold.view()


def _leave(h: Any, holder: dict, lanes: dict, slot_of: dict) -> None:
    """Experiment ``h`` ended (or was dispatched again): it frees its slot for the first one
    queued ahead behind it, or leaves the queue it waited in."""
    slot = slot_of.pop(h)
    lane = lanes.get(slot, [])
    if h in lane:
        lane.remove(h)
    elif holder.get(slot) == h:
        del holder[slot]
        if lane:
            holder[slot] = lane.pop(0)
