"""Dashboard components: one class per figure, each with ``root``, ``source`` and ``update()``.

They read the scheduler's event log (and, for running shards, the scheduler's task states)
and never change either.

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

import html
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import processing_keys
from ..events import topic, unpack
from ..montecarlo.keys import parse_block_key
from .shard_cells import MAX_CELLS as MAX_CELLS  # where the page's callers read it
from .shard_cells import STATE_NAMES, ShardCells, check_start

logger = logging.getLogger(__name__)

__all__ = ["ShardBoard", "ExperiencePanel", "BranchBoard", "branch_view", "shard_states", "run_status", "plane_series", "STATE_NAMES", "STATE_COLORS"]

STATE_COLORS = ["#d9d9d9", "#4c72b0", "#55a868", "#1b5e20", "#c44e52", "#dd8452"]


def skip_bad_event(page: str, msg: Any, reason: str) -> None:
    """One warning for an event a page cannot read (a buggy producer, another client's version)."""
    logger.warning("research %s page: skipped an event it cannot read (%s): %.200r", page, reason, msg)


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
            return f"failed: {msg.get('reason') or msg.get('error') or 'unknown reason'}"
    client = start.get("client")
    if clients is not None and client and client not in clients:
        return f"stale: its client {client} has left the scheduler"
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
        self.start: dict | None = None           # the latest run's start event, its cells and end events
        self.cells: ShardCells | None = None
        self.ends: list[dict] = []
        self.estimate: dict | None = None        # the latest accepted event with a running estimate
        self._last: Any = None                   # the last log entry folded in
        self._drawn = -1
        self._xy: tuple[list, list, list] = ([], [], [])

    def _fold_new_events(self) -> None:
        """Fold in the events logged since the last update (all of them after the log wrapped).

        Work follows the new events and the cells, never the run's shards (issue 28: a
        10^7-shard run cost 1.5 s of the scheduler's event loop per update)."""
        log = self.scheduler.get_events(topic("montecarlo"))
        fresh = len(log)
        if self._last is not None:
            for back in range(1, len(log) + 1):
                if log[-back] is self._last:
                    fresh = back - 1
                    break
            else:          # the log wrapped past what was folded in: start over from what it holds
                self.start, self.cells, self.ends, self.estimate = None, None, [], None
        if not fresh:
            return
        self._last = log[-1]
        for _, msg in unpack(log[len(log) - fresh:]):
            kind = msg.get("event")
            if kind == "start":
                reason = check_start(msg)
                if reason is not None:
                    skip_bad_event("Shards", msg, reason)
                    continue
                self.start, self.cells, self.ends, self.estimate = msg, ShardCells(int(msg["shards"])), [], None
                continue
            if self.cells is None or self.start is None or msg.get("run") != self.start["run"]:
                continue
            if kind in ("done", "failed"):
                self.ends.append(msg)
                continue
            try:
                self.cells.apply(msg)
            except ValueError as e:
                skip_bad_event("Shards", msg, str(e))
                continue
            if kind == "accepted" and msg.get("mean") is not None:
                self.estimate = msg

    def update(self) -> None:
        self._fold_new_events()
        start, cells = self.start, self.cells
        if start is None or cells is None:
            return
        status = run_status(start, self.ends, clients=set(getattr(self.scheduler, "clients", {}) or ()))
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
        acc = self.estimate
        if acc is not None:
            word = "running estimate" if status == "running" else "estimate"
            try:
                half = 1.96 * float(acc["stderr"])
                est = (f"{word} {float(acc['mean']):.6g} &plusmn; {half:.3g} (95 % CI of the mean; "
                       f"stderr {float(acc['stderr']):.3g}; n={int(acc['n']):,})")
            except (KeyError, TypeError, ValueError):
                skip_bad_event("Shards", acc, "mean, stderr and n are not numbers")
                self.estimate = None
        # Names come from users: escaped, so a job called "<script>" is text, not markup.
        name, run = html.escape(str(start.get("name", ""))), html.escape(str(start["run"])[:12])
        self.summary.text = (f"<b>{name}</b> <code>{run}</code> "
                             f"({html.escape(status)}): {cells.n:,} shards, " + ", ".join(f"{v:,} {k}" for k, v in counts.items() if v)
                             + (f"<br>{est}" if est else ""))


_STATS_NUMBERS = ("t", "size", "inserted", "sampled", "exposed_mean_s")


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
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            return f"{key} {v!r} is not a finite number"
    step = m.get("step_mean_s")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float, np.integer, np.floating))):
        return f"step_mean_s {step!r} is not a number"
    tiers = m.get("tiers", [])
    # a list as published; a tuple once it crossed a Dask comm (msgpack decodes arrays as tuples)
    if not isinstance(tiers, (list, tuple)) or not all(
            isinstance(t, dict) and isinstance(t.get("rows"), (int, np.integer)) and isinstance(t.get("used"), (int, np.integer))
            for t in tiers):
        return "tiers is not a list of {name, rows, used}"
    return None


def plane_series(events: list) -> dict[str, dict[str, list]]:
    """Per plane: time series of size, ingest and sample rates, exposed latency (from ``stats``).

    A rate is taken over at least half the plane's usual publishing interval: the last event of
    a run comes a few milliseconds after the one before (published when the plane closes), and
    255 transitions in 18 ms drew an ingest spike of 14,000/s over a run of 500/s.

    >>> ev = [(i, {"event": "stats", "plane": "p", "t": t, "size": n, "capacity": 10**6, "inserted": n,
    ...            "sampled": 0, "tiers": [], "exposed_mean_s": 0.0})
    ...       for i, (t, n) in enumerate([(0.0, 0), (1.0, 500), (2.0, 1000), (3.0, 1500), (3.018, 1509)])]
    >>> [round(r) for r in plane_series(ev)["p"]["ingest_rate"]]
    [0, 500, 500, 500, 500]
    """
    out: dict[str, dict[str, list]] = {}
    recent: dict[str, list[dict]] = {}              # the plane's last few events: rate bases
    for _, m in unpack(events):
        if m.get("event") != "stats":
            continue
        reason = _bad_stats(m)
        if reason is not None:
            skip_bad_event("Experience", m, reason)
            continue
        name = str(m.get("plane", "plane"))
        s = out.setdefault(name, {"t": [], "size": [], "ingest_rate": [], "sample_rate": [],
                                  "exposed_ms": [], "exposed_pct": [], "tiers": []})
        prev = _rate_base(recent.setdefault(name, []), m["t"])
        dt = (m["t"] - prev["t"]) if prev else 0.0
        s["t"].append(m["t"] * 1000.0)
        s["size"].append(m["size"])
        # a cluster plane's count drops when a shard is lost: a rate is never negative
        s["ingest_rate"].append(max(0.0, (m["inserted"] - prev["inserted"]) / dt) if prev and dt > 0 else 0.0)
        s["sample_rate"].append(max(0.0, (m["sampled"] - prev["sampled"]) / dt) if prev and dt > 0 else 0.0)
        s["exposed_ms"].append(m["exposed_mean_s"] * 1e3)
        step = m.get("step_mean_s") or 0.0
        s["exposed_pct"].append(100.0 * m["exposed_mean_s"] / step if step > 0 else 0.0)
        s["tiers"] = m.get("tiers", [])
        recent[name] = (recent[name] + [m])[-8:]
    return out


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
    import time

    now = time.time() if now is None else now
    ago = max(0.0, now - t_last)
    text = f"last update {time.strftime('%H:%M:%S', time.localtime(t_last))} ({ago:.0f} s ago"
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

    def update(self) -> None:
        series = plane_series(_log(self.scheduler, "replay"))
        if not series:
            return
        name = max(series, key=lambda k: series[k]["t"][-1])   # the plane that published last
        s = series[name]
        self.source.data = {k: s[k] for k in ("t", "ingest_rate", "sample_rate", "exposed_ms", "exposed_pct")}
        tiers = s["tiers"]
        self.tiers.data = {"tier": [t["name"] for t in tiers], "used": [t["used"] for t in tiers],
                           "free": [max(0, t["rows"] - t["used"]) for t in tiers]}
        self.tier_range.factors = [t["name"] for t in tiers]
        pct = s["exposed_pct"][-1] if s["exposed_pct"] else 0.0
        t = s["t"]
        interval = (t[-1] - t[-2]) / 1000.0 if len(t) > 1 else None
        self.summary.text = (f"<b>{html.escape(name)}</b>: {s['size'][-1]:,} transitions stored; "
                             f"learner exposed latency {s['exposed_ms'][-1]:.3f} ms ({pct:.1f} % of a step)"
                             + (f"; {len(series)} planes publishing" if len(series) > 1 else "")
                             + f"; {freshness(t[-1] / 1000.0, interval=interval)}")


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def branch_view(events: list, max_lines: int = 10) -> dict[str, Any] | None:
    """Per-branch state, score lines and slot use of the latest experiments run.

    A branch's score line starts at its first result (before it, its score is the bonus over no
    data: infinite, or a guess) and its points are the selections, drawn as steps. Slot use
    counts the experiments that hold a slot, and apart from them those queued ahead behind a
    slot's running experiment (a dispatch with ``ahead``, which starts when that one ends),
    so three slots never read as six experiments running.

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
    records: list[dict] = []
    run = None
    for _, r in unpack(events):
        if r.get("run") != run:
            if r.get("event") != "add" and run is not None:
                continue
            if r.get("event") == "add" and r.get("run") != run:
                run, records = r.get("run"), []
        records.append(r)
    if run is None:
        return None
    branches: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    scores: dict[str, tuple[list, list]] = {}
    measured: set[str] = set()                      # branches with a result so far
    busy_t, busy_n, ahead_n = [0.0], [0], [0]
    holder: dict[Any, Any] = {}                     # slot -> the experiment running there
    lanes: dict[Any, list] = {}                     # slot -> experiments queued ahead behind it
    slot_of: dict[Any, Any] = {}                    # experiment -> its slot, until it ends
    stop = None

    def occupancy(t: float) -> None:
        busy_t.append(t)
        busy_n.append(len(holder))
        ahead_n.append(sum(map(len, lanes.values())))

    for r in records:
        b: Any = r.get("branch")
        kind, t = r.get("event"), _num(r.get("t"))
        if b is not None and b not in branches:
            branches[b] = {"runs": 0, "pending": 0, "mean": math.nan, "pruned": False, "paper": False}
            order.append(b)
        if kind == "select":
            for name, v in (r.get("scores") or {}).items():
                if name in measured:
                    xs, ys = scores.setdefault(name, ([], []))
                    xs.append(t)
                    ys.append(_num(v))
        elif kind == "dispatch":
            h = r.get("hypothesis", ("dispatch", r.get("seq"), t))
            if h in slot_of:                        # a re-dispatch: the first one left its slot
                _leave(h, holder, lanes, slot_of)
            else:
                branches[b]["pending"] += 1
            slot = r.get("slot", ("own", h))
            slot_of[h] = slot
            if r.get("ahead") and slot in holder:
                lanes.setdefault(slot, []).append(h)
            else:
                holder[slot] = h
            occupancy(t)
        elif kind in ("result", "failure", "finish", "cancel"):
            h = r.get("hypothesis")
            if kind in ("result", "failure") and b in branches:
                br = branches[b]
                br["pending"] = max(0, br["pending"] - 1)
                if kind == "result":
                    br["runs"] += 1
                    br["mean"] = _num(r.get("mean"))
                    measured.add(b)
            if h in slot_of:
                _leave(h, holder, lanes, slot_of)
            elif h is None and holder:              # an old log without hypothesis ids
                holder.pop(next(iter(holder)))
            occupancy(t)
        elif kind == "prune":
            branches[b]["pruned"] = True
        elif kind == "paper.trigger":
            branches[b]["paper"] = True
        elif kind == "stop":
            stop = r.get("reason")
    top = sorted(order, key=lambda name: -branches[name]["runs"])[:max_lines]
    return {"run": run, "branches": branches, "order": order, "scores": {k: scores[k] for k in top if k in scores},
            "occupancy": (busy_t, busy_n, ahead_n), "stop": stop}


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

    def update(self) -> None:
        view = branch_view(_log(self.scheduler, "experiments"))
        if view is None:
            return
        br = view["branches"]
        names = view["order"][:200]
        color = ["#c44e52" if br[n]["pruned"] else "#ccb974" if br[n]["paper"] else "#4c72b0" for n in names]
        status = ["pruned" if br[n]["pruned"] else "paper" if br[n]["paper"] else "active" for n in names]
        self.source.data = {"branch": names, "mean": [0.0 if math.isnan(br[n]["mean"]) else br[n]["mean"] for n in names],
                            "runs": [br[n]["runs"] for n in names], "pending": [br[n]["pending"] for n in names],
                            "color": color, "status": status}
        self.branch_range.factors = names
        lines = [(name, *_steps(xs, [y if math.isfinite(y) else math.nan for y in ys]))
                 for name, (xs, ys) in view["scores"].items()]
        self.lines.data = {"xs": [x for _, x, _ in lines], "ys": [y for _, _, y in lines],
                           "color": [self.COLORS[i % len(self.COLORS)] for i in range(len(lines))],
                           "branch": [n for n, _, _ in lines]}
        t, n, ahead = view["occupancy"]
        self.occ.data = {"t": t, "n": n, "ahead": ahead}
        runs = sum(b["runs"] for b in br.values())
        papers = [html.escape(str(k)) for k, b in br.items() if b["paper"]]
        pruned = sum(b["pruned"] for b in br.values())
        self.summary.text = (f"run <code>{html.escape(str(view['run']))}</code>: {len(br)} branches, {runs} results, "
                             f"{pruned} pruned, papers: {', '.join(papers) or 'none'}"
                             + (f"; stopped: {html.escape(str(view['stop']))}" if view["stop"] else ""))
