"""Dashboard components: one class per figure, each with ``root``, ``source`` and ``update()``.

Each page draws a fold of its topic's events (:class:`ShardFold`, :class:`BranchFold`,
:class:`PlaneFold`). Where the scheduler runs the research plugin
(:class:`~dask_research.dashboard.plugin.ResearchEventsPlugin`, installed by the
``dask_research.dashboard`` preload and at the first page opened), the page reads the
plugin's fold, which saw every event from the moment it was installed, so a page opened late
shows the whole of the run; where it does not, the page folds the scheduler's event log itself
(:class:`_LogCursor`) and sees what the log still holds. Pages read the events (and, for
running shards, the scheduler's task states) and never change either.

Examples
--------
>>> from dask_research.dashboard.components import shard_states
>>> import numpy as np
>>> events = [(0.0, {"event": "start", "run": "r", "shards": 4, "key_prefix": "p"}),
...           (1.0, {"event": "accepted", "run": "r", "start": 0, "stop": 2})]
>>> shard_states(events, running=[(2, 3)])[1].tolist()
[2, 2, 1, 0]
"""
from __future__ import annotations

import heapq
import html
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

import numpy as np

from .._compat import processing_keys
from ..events import topic, unpack
from ..montecarlo.keys import parse_block_key
from .shard_cells import MAX_CELLS as MAX_CELLS  # where the page's callers read it
from .shard_cells import STATE_NAMES, ShardCells, check_start

logger = logging.getLogger(__name__)

__all__ = ["ShardBoard", "ExperiencePanel", "BranchBoard", "ShardFold", "BranchFold", "PlaneFold", "branch_view",
           "shard_states", "run_status", "plane_series", "feed_event", "STATE_NAMES", "STATE_COLORS"]

STATE_COLORS = ["#d9d9d9", "#4c72b0", "#55a868", "#1b5e20", "#c44e52", "#dd8452"]


def skip_bad_event(page: str, msg: Any, reason: str) -> None:
    """One warning for an event a page cannot read (a buggy producer, another client's version)."""
    logger.warning("research %s page: skipped an event it cannot read (%s): %.200r", page, reason, msg)


def feed_event(fold: Any, msg: dict, page: str) -> None:
    """Give one event to ``fold.feed``; an event it refuses (it returns why), or one it fails on,
    is skipped with one warning naming ``page`` (:func:`skip_bad_event`), never raised."""
    try:
        reason = fold.feed(msg)
    except Exception as e:  # noqa: BLE001 - a fold's bug must cost one event, not the page or the scheduler
        reason = f"{type(e).__name__}: {_short(e)}"
    if reason is not None:
        skip_bad_event(page, msg, reason)


def latest_run(events: list) -> tuple[dict | None, list]:
    """The latest ``start`` event and the events of that run after it.

    ``events`` is a topic's log (``(time, message)`` pairs); batches are opened
    (:func:`dask_research.events.unpack`).
    """
    events = list(unpack(events))
    start_i = None
    for i in range(len(events) - 1, -1, -1):
        msg = events[i][1]
        if isinstance(msg, dict) and msg.get("event") == "start":
            start_i = i
            break
    if start_i is None:
        return None, []
    start = events[start_i][1]
    return start, [m for _, m in events[start_i + 1:] if m.get("run") == start["run"]]


def shard_states(events: list, running: Sequence[tuple[int, int]] = ()) -> tuple[dict | None, np.ndarray]:
    """State code per shard of the latest run (per cell of shards past :data:`MAX_CELLS`; see
    :data:`STATE_NAMES` and :class:`~.shard_cells.ShardCells`). Malformed events are skipped
    with one warning each; a malformed ``start`` is no run."""
    start, later = latest_run(events)
    if start is None or check_start(start) is not None:
        return None, np.zeros(0, dtype=np.int8)
    cells = ShardCells(int(start["shards"]))
    for msg in later:
        try:
            cells.apply(msg)
        except ValueError as e:
            skip_bad_event("Shards", msg, str(e))
    return start, cells.states(running)


def run_status(start: dict, later: list, clients=None) -> str:
    """What became of a run: ``done``, ``failed: <reason>``, ``stale: ...`` or ``running``.

    ``later`` are the run's events after its ``start`` (see :func:`latest_run`); ``clients``
    the ids of the clients the scheduler has now (``scheduler.clients``). A run that neither
    finished nor failed and whose client has left the scheduler is stale: nobody drives it.

    Examples
    --------
    >>> run_status({"run": "r", "client": "c1"}, [{"event": "failed", "reason": "boom"}])
    'failed: boom'
    >>> run_status({"run": "r", "client": "c1"}, [], clients={"c2"})
    'stale: its client c1 has left the scheduler'
    """
    for msg in reversed(later):
        kind = msg.get("event")
        if kind == "done":
            return "done"
        if kind == "failed":
            return f"failed: {_short(msg.get('reason') or msg.get('error') or 'unknown reason')}"
    client = start.get("client")
    if clients is not None and client and (not _hashable(client) or client not in clients):
        return f"stale: its client {_short(client, 80)} has left the scheduler"
    return "running"


def _running_blocks(scheduler, prefix: str) -> list[tuple[int, int]]:
    out = []
    for key in processing_keys(scheduler):
        block = parse_block_key(key)
        if block is not None and block.tag == prefix:
            out.append((block.start, block.stop))
    return out


def _log(scheduler, subsystem: str) -> list[tuple[float, Any]]:
    """The log of ``subsystem``'s topic (``research.<subsystem>.event-topic``) on ``scheduler``."""
    return list(scheduler.get_events(topic(subsystem)))


class _LogCursor:
    """Where a page got to in a topic's log: an update reads only the entries logged since.

    The scheduler keeps the last ``distributed.admin.low-level-log-length`` entries of a topic
    and hands the same entry objects back on every ``get_events``, so the last entry read is
    found again by identity. Where it is gone (the log wrapped past it between two updates)
    every entry the log holds is new.

    >>> cur = _LogCursor()
    >>> log = [(0.0, "a"), (1.0, "b")]
    >>> cur.new(log), cur.new(log), cur.new(log + [(2.0, "c")])
    (([(0.0, 'a'), (1.0, 'b')], False), ([], False), ([(2.0, 'c')], False))
    >>> cur.new([(3.0, "d")])
    ([(3.0, 'd')], True)
    """

    def __init__(self) -> None:
        self.last: Any = None

    def new(self, log: Sequence) -> tuple[list, bool]:
        """The entries of ``log`` after the last one read, and whether the log wrapped past it."""
        fresh, wrapped = len(log), False
        if self.last is not None:
            for back in range(1, len(log) + 1):
                if log[-back] is self.last:
                    fresh = back - 1
                    break
            else:
                wrapped = True
        if fresh:
            self.last = log[-1]
        return list(log[len(log) - fresh:]), wrapped

    def feed(self, log: Sequence, fold: Any, page: str) -> list:
        """The entries of ``log`` after the last one read, each of their events given to
        ``fold.feed``; an event it refuses (it returns why) is skipped with one warning naming
        ``page`` (:func:`skip_bad_event`)."""
        entries, _ = self.new(log)
        for _, msg in unpack(entries):
            feed_event(fold, msg, page)
        return entries


class _Feed:
    """Where a page's fold comes from, and how many events it took since the page last looked.

    Where ``scheduler`` runs the research plugin (:mod:`dask_research.dashboard.plugin`), the
    page reads the plugin's fold of ``subsystem``: it was fed as the scheduler logged each event,
    so :meth:`poll` reads no log and costs nothing but a subtraction. Elsewhere (a scheduler
    without the plugin, an older Dask, a stand-in) the page has its own ``fold_type()`` and
    :meth:`poll` folds in the log entries since the last poll (:class:`_LogCursor`). Which one
    is decided when the page is made.
    """

    def __init__(self, scheduler: Any, subsystem: str, fold_type: Any, page: str) -> None:
        from .plugin import folds_of  # the plugin's module imports this one

        shared = folds_of(scheduler)
        self.scheduler, self.subsystem, self.page = scheduler, subsystem, page
        self.shared = shared is not None
        self.fold: Any = shared[subsystem] if shared is not None else fold_type()
        self.cursor = None if shared is not None else _LogCursor()
        self.seen = 0                           # the fold's ``fed`` when the page last looked

    def poll(self) -> int:
        """How many events the fold took since the last poll (folding them in first, from the
        log, where the page has its own fold)."""
        if self.cursor is not None:
            entries, wrapped = self.cursor.new(self.scheduler.get_events(topic(self.subsystem)))
            if wrapped and hasattr(self.fold, "log_wrapped"):
                self.fold.log_wrapped()
            for _, msg in unpack(entries):
                feed_event(self.fold, msg, self.page)
        new, self.seen = self.fold.fed - self.seen, self.fold.fed
        return new


def _short(value: Any, limit: int = 200) -> str:
    """``str(value)`` cut to ``limit`` characters (a page shows names, never a whole essay).

    >>> _short("x" * 300, 10)
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


class ShardBoard:
    """A grid of the active Monte-Carlo run's shards (cells of shards past :data:`MAX_CELLS`), and its
    running estimate with the 95 % confidence interval of the mean (as the CLI and ``print(result)``)."""

    def __init__(self, scheduler, width: int = 900, **kwargs: Any):
        from bokeh.models import ColumnDataSource, HoverTool
        from bokeh.models.widgets import Div
        from bokeh.plotting import figure

        self.scheduler = scheduler
        self.source = ColumnDataSource({"x": [], "y": [], "color": [], "state": [], "shards": []})
        fig = figure(title="Shards", height=kwargs.get("height", 420), width=width, tools="",
                     toolbar_location=None, x_axis_type=None, y_axis_type=None,
                     sizing_mode=kwargs.get("sizing_mode"))
        fig.rect(x="x", y="y", width=0.9, height=0.9, color="color", source=self.source)
        fig.add_tools(HoverTool(tooltips=[("shards", "@shards"), ("state", "@state")]))
        fig.grid.visible = False
        self.figure = fig
        self.summary = Div(text="No Monte-Carlo run yet.")
        legend = " ".join(f"<span style='color:{c}'>&#9632;</span> {n}" for n, c in zip(STATE_NAMES, STATE_COLORS))
        from bokeh.layouts import column

        self.root = column(self.summary, Div(text=legend), fig, sizing_mode=kwargs.get("sizing_mode"))
        self._feed = _Feed(scheduler, "montecarlo", ShardFold, "Shards")
        self.fold: ShardFold = self._feed.fold
        self._drawn = -1
        self._xy: tuple[list, list, list] = ([], [], [])

    @property
    def start(self) -> dict | None:
        """The ``start`` event of the run shown (``None``: no run yet)."""
        return self.fold.start

    @property
    def cells(self) -> ShardCells | None:
        """The cells of the run shown."""
        return self.fold.cells

    @property
    def missed(self) -> bool:
        """Whether the page missed events of the run shown (only a page that reads the log itself)."""
        return self.fold.missed

    def update(self) -> None:
        """Fold in what is new (see :class:`_Feed`) and redraw the run held (its running blocks
        are the scheduler's tasks now). Where the page reads the log itself and the log wrapped
        past the last event read (more events between two updates than the scheduler keeps),
        the events it dropped are lost to the page, which goes on with the run it showed and
        says that it missed some; with the research plugin nothing is missed."""
        self._feed.poll()
        fold = self.fold
        start, cells = fold.start, fold.cells
        if start is None or cells is None:
            return
        status = run_status(start, list(fold.ends), clients=set(getattr(self.scheduler, "clients", {}) or ()))
        # A run that ended (or lost its client) drives no task: blocks being cancelled are not running.
        running = _running_blocks(self.scheduler, str(start.get("key_prefix", ""))) if status == "running" else []
        pick = cells.states(running)
        idx = np.arange(cells.cells)
        cols = max(1, math.ceil(math.sqrt(cells.cells * 2)))
        if cells.cells != self._drawn:          # positions and labels change only with the run's size
            self._drawn = cells.cells
            self._xy = ((idx % cols).tolist(), (-(idx // cols)).tolist(), cells.labels())
        x, y, labels = self._xy
        self.source.data = {"x": x, "y": y, "color": [STATE_COLORS[c] for c in pick],
                            "state": [STATE_NAMES[c] for c in pick], "shards": labels}
        counts = cells.shard_counts(running)
        est = ""
        acc = fold.estimate                     # numbers: checked as the event was folded in
        if acc is not None:
            word = "running estimate" if status == "running" else "estimate"
            est = (f"{word} {acc['mean']:.6g} &plusmn; {1.96 * acc['stderr']:.3g} (95 % CI of the mean; "
                   f"stderr {acc['stderr']:.3g}; n={acc['n']:,})")
        # Names come from users: escaped, so a job called "<script>" is text, not markup.
        name, run = html.escape(_short(start.get("name", ""))), html.escape(str(start["run"])[:12])
        self.summary.text = (f"<b>{name}</b> <code>{run}</code> "
                             f"({html.escape(status)}): {cells.n:,} shards, " + ", ".join(f"{v:,} {k}" for k, v in counts.items() if v)
                             + (f"<br>{est}" if est else "")
                             + ("<br>(the scheduler's event log dropped some of this run's events before "
                                "the page read them: counts may be low)" if self.missed else ""))


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
        name = _short(m.get("plane", "plane"), 200)
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


def freshness(t_last: float, now: float | None = None, interval: float | None = None) -> str:
    """``"last update HH:MM:SS (N s ago)"`` for an event at wall time ``t_last`` (local time).

    With ``interval`` (seconds between the plane's events), an update older than three
    intervals (and at least 10 s) is called stale.

    >>> import time
    >>> t = time.mktime((2026, 12, 1, 10, 47, 3, 0, 0, -1))
    >>> freshness(t, now=t + 4.2)
    'last update 10:47:03 (4 s ago)'
    >>> freshness(t, now=t + 64, interval=1.0)
    'last update 10:47:03 (64 s ago; stale: the plane has stopped publishing)'
    """
    now = time.time() if now is None else now
    ago = max(0.0, now - t_last)
    try:
        when = time.strftime('%H:%M:%S', time.localtime(t_last))
    except (OverflowError, ValueError, OSError):     # a time no clock reads (another client's bug)
        when = f"t={t_last:.6g}"
    text = f"last update {when} ({ago:.0f} s ago"
    if interval is not None and ago > max(10.0, 3 * interval):
        text += "; stale: the plane has stopped publishing"
    return text + ")"


class ExperiencePanel:
    """Tier occupancy, ingest and sample rates, and the learner's exposed latency over time."""

    def __init__(self, scheduler, width: int = 900, **kwargs: Any):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, FactorRange
        from bokeh.models.widgets import Div
        from bokeh.plotting import figure

        from ..html_report import outside_legend

        self.scheduler = scheduler
        sizing = kwargs.get("sizing_mode")
        self.source = ColumnDataSource({"t": [], "ingest_rate": [], "sample_rate": [], "exposed_ms": [],
                                        "exposed_pct": []})
        self.tiers = ColumnDataSource({"tier": [], "used": [], "free": []})
        self.summary = Div(text="No experience plane has published statistics yet.")
        rates = figure(title="Ingest and sample rate (transitions/s)", x_axis_type="datetime", height=260,
                       width=width // 2, tools="", toolbar_location=None, sizing_mode=sizing)
        rates.line("t", "ingest_rate", source=self.source, color="#4c72b0", line_width=2, legend_label="ingest")
        rates.line("t", "sample_rate", source=self.source, color="#dd8452", line_width=2, legend_label="sample")
        outside_legend(rates)                       # never over the lines
        latency = figure(title="Learner exposed latency (ms, mean per interval)", x_axis_type="datetime",
                         height=260, width=width // 2, tools="", toolbar_location=None, sizing_mode=sizing)
        latency.line("t", "exposed_ms", source=self.source, color="#c44e52", line_width=2)
        latency.scatter("t", "exposed_ms", source=self.source, color="#c44e52", size=5)
        self.tier_range = FactorRange()
        self.tier_fig = figure(title="Tier occupancy (rows)", y_range=self.tier_range, height=220, width=width,
                               tools="", toolbar_location=None, sizing_mode=sizing)
        self.tier_fig.hbar_stack(["used", "free"], y="tier", height=0.6, color=["#55a868", "#d9d9d9"],
                                 source=self.tiers)
        self.root = column(self.summary, row(rates, latency, sizing_mode=sizing), self.tier_fig, sizing_mode=sizing)
        self._feed = _Feed(scheduler, "replay", PlaneFold, "Experience")
        self.fold: PlaneFold = self._feed.fold
        self._plane: str | None = None      # the plane drawn, and how many of its points were sent
        self._sent = 0
        self._summary_at = -math.inf

    def update(self) -> None:
        """Fold in the replay events logged since the last update (see :class:`_Feed`); redraw
        the latest plane.

        Its series are streamed (only the new points go to the browser)."""
        self._feed.poll()
        fold = self.fold
        name = fold.latest
        if name is None or name not in fold.series:
            return
        s, total = fold.series[name], fold.total[name]
        new = total - self._sent if name == self._plane else total
        if not new and not self._stale_summary():
            return
        columns = ("t", "ingest_rate", "sample_rate", "exposed_ms", "exposed_pct")
        if name != self._plane or new > len(s["t"]):
            self.source.data = {k: list(s[k]) for k in columns}
        elif new:
            self.source.stream({k: _tail(s[k], new) for k in columns}, rollover=fold.MAX_POINTS)
        self._plane, self._sent = name, total
        tiers = s["tiers"]
        self.tiers.data = {"tier": [t["name"] for t in tiers], "used": [t["used"] for t in tiers],
                           "free": [max(0.0, t["rows"] - t["used"]) for t in tiers]}
        self.tier_range.factors = [t["name"] for t in tiers]
        pct = s["exposed_pct"][-1] if s["exposed_pct"] else 0.0
        t = s["t"]
        interval = (t[-1] - t[-2]) / 1000.0 if len(t) > 1 else None
        self._summary_at = time.monotonic()
        self.summary.text = (f"<b>{html.escape(name)}</b>: {s['size'][-1]:,.0f} transitions stored; "
                             f"learner exposed latency {s['exposed_ms'][-1]:.3f} ms ({pct:.1f} % of a step)"
                             + (f"; {len(fold.series)} planes publishing" if len(fold.series) > 1 else "")
                             + f"; {html.escape(freshness(t[-1] / 1000.0, interval=interval))}")

    def _stale_summary(self) -> bool:
        """Whether the summary's "N s ago" is due a refresh (once a second) with no new event."""
        return time.monotonic() - self._summary_at >= 1.0


def _num(x: Any) -> float:
    """``float(x)``, or NaN for what is not a number (a string, None, an int past float's range).

    >>> _num("inf"), _num(None), _num(10**400)
    (inf, nan, nan)
    """
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _hashable(*values: Any) -> bool:
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
            if not _hashable(h, slot):
                return "its hypothesis or slot is not an id"
        elif kind in ("result", "failure", "finish", "cancel"):
            h = r.get("hypothesis")
            if not _hashable(h):
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


def _steps(xs: list, ys: list) -> tuple[list, list]:
    """A line's points as steps: each value holds until the next point.

    >>> _steps([0.0, 1.0, 3.0], [2.0, 1.5, 1.2])
    ([0.0, 1.0, 1.0, 3.0, 3.0], [2.0, 2.0, 1.5, 1.5, 1.2])
    """
    if not xs:
        return [], []
    out_x, out_y = [xs[0]], [ys[0]]
    for x, y in zip(xs[1:], ys[1:]):
        out_x += [x, x]
        out_y += [out_y[-1], y]
    return out_x, out_y


class BranchBoard:
    """UCB score over time for the busiest branches, per-branch mean/runs/pending, slot use."""

    COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
              "#ccb974", "#64b5cd"]

    def __init__(self, scheduler, width: int = 900, **kwargs: Any):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, FactorRange, HoverTool
        from bokeh.models.widgets import Div
        from bokeh.plotting import figure

        from ..html_report import outside_legend

        self.scheduler = scheduler
        sizing = kwargs.get("sizing_mode")
        self.summary = Div(text="No experiments run yet.")
        self.branch_range = FactorRange()
        self.source = ColumnDataSource({"branch": [], "mean": [], "runs": [], "pending": [], "color": [],
                                        "status": []})
        self.bars = figure(title="Mean reward per branch (red: pruned, gold: paper triggered)", x_range=self.branch_range,
                           height=280, width=width, tools="", toolbar_location=None, sizing_mode=sizing)
        self.bars.vbar(x="branch", top="mean", width=0.8, color="color", source=self.source)
        self.bars.add_tools(HoverTool(tooltips=[("branch", "@branch"), ("mean", "@mean"), ("runs", "@runs"),
                                                ("pending", "@pending"), ("status", "@status")]))
        self.lines = ColumnDataSource({"xs": [], "ys": [], "color": [], "branch": []})
        self.score_fig = figure(title="UCB score at each selection (busiest branches)", height=260,
                                width=width // 2, tools="", toolbar_location=None, sizing_mode=sizing,
                                x_axis_label="seconds since start",
                                y_axis_label="UCB score (mean + bonus)")
        glyph = self.score_fig.multi_line("xs", "ys", color="color", source=self.lines, line_width=2,
                                          legend_field="branch")
        self.score_fig.legend.label_text_font_size = "8pt"
        outside_legend(self.score_fig)              # never over the lines
        self.score_fig.add_tools(HoverTool(renderers=[glyph], tooltips=[("branch", "@branch")]))
        self.occ = ColumnDataSource({"t": [], "n": [], "ahead": []})
        self.occ_fig = figure(title="Slots in use, and experiments queued ahead", height=260, width=width // 2,
                              tools="", toolbar_location=None, sizing_mode=sizing, x_axis_label="seconds since start",
                              y_axis_label="experiments")
        self.occ_fig.step("t", "n", source=self.occ, mode="after", line_width=2, color="#4c72b0",
                          legend_label="running")
        self.occ_fig.step("t", "ahead", source=self.occ, mode="after", line_width=1, color="#8c8c8c",
                          line_dash="dashed", legend_label="queued ahead")
        self.occ_fig.legend.label_text_font_size = "8pt"
        outside_legend(self.occ_fig)
        self.root = column(self.summary, self.bars, row(self.score_fig, self.occ_fig, sizing_mode=sizing),
                           sizing_mode=sizing)
        self._feed = _Feed(scheduler, "experiments", BranchFold, "Branches")
        self.fold: BranchFold = self._feed.fold
        self._drawn_epoch = 0                # the fold's epoch last drawn (0: nothing drawn yet)
        self._occ_sent = 0                   # slot-use points sent to the browser

    def update(self) -> None:
        """Fold in the experiments events logged since the last update (see :class:`_Feed`);
        redraw if there were any.

        The bars show the first 200 branches; the slot-use series is streamed (only its new
        points go to the browser)."""
        new_events = self._feed.poll()
        fold = self.fold
        if not fold.started or (not new_events and self._drawn_epoch == fold.epoch):
            return
        br = fold.branches
        names = fold.order[:200]
        color = ["#c44e52" if br[n]["pruned"] else "#ccb974" if br[n]["paper"] else "#4c72b0" for n in names]
        status = ["pruned" if br[n]["pruned"] else "paper" if br[n]["paper"] else "active" for n in names]
        means = [br[n]["mean"] for n in names]
        self.source.data = {"branch": names, "mean": [m if math.isfinite(m) else 0.0 for m in means],
                            "runs": [br[n]["runs"] for n in names], "pending": [br[n]["pending"] for n in names],
                            "color": color, "status": status}
        self.branch_range.factors = names
        lines = [(name, *_steps(list(fold.scores[name][0]), [y if math.isfinite(y) else math.nan
                                                              for y in fold.scores[name][1]]))
                 for name in fold.top()]
        self.lines.data = {"xs": [x for _, x, _ in lines], "ys": [y for _, _, y in lines],
                           "color": [self.COLORS[i % len(self.COLORS)] for i in range(len(lines))],
                           "branch": [n for n, _, _ in lines]}
        new = fold.occupancy_total - self._occ_sent
        if self._drawn_epoch != fold.epoch or new > len(fold.busy_t):
            self.occ.data = {"t": list(fold.busy_t), "n": list(fold.busy_n), "ahead": list(fold.ahead_n)}
        elif new:
            self.occ.stream({"t": _tail(fold.busy_t, new), "n": _tail(fold.busy_n, new),
                             "ahead": _tail(fold.ahead_n, new)}, rollover=fold.MAX_OCCUPANCY)
        self._occ_sent, self._drawn_epoch = fold.occupancy_total, fold.epoch
        papers = [html.escape(_short(k, 80)) for k in fold.papers[:20]] + (["…"] if len(fold.papers) > 20 else [])
        stop = fold.stop
        self.summary.text = (f"run <code>{html.escape(_short(fold.run, 80))}</code>: {len(br)} branches, "
                             f"{fold.results} results, {len(fold.pruned)} pruned, papers: {', '.join(papers) or 'none'}"
                             + (f"; stopped: {html.escape(_short(stop))}" if stop else ""))


def _tail(values: deque, n: int) -> list:
    """The last ``n`` of ``values`` in order, in time proportional to ``n``.

    >>> _tail(deque([1, 2, 3, 4]), 2)
    [3, 4]
    """
    return list(islice(reversed(values), n))[::-1]
