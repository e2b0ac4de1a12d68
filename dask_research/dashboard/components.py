"""Dashboard components: one class per figure, each with ``root``, ``source`` and ``update()``.

Each page draws a fold of its topic's events (:mod:`.folds`: :class:`~.folds.ShardFold`,
:class:`~.folds.BranchFold`, :class:`~.folds.PlaneFold`). Where the scheduler runs the research plugin
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
from .folds import (
    BranchFold,
    PlaneFold,
    ShardFold,
    all_hashable,
    feed_event,
    short_text,
    skip_bad_event,
)
from .plugin import folds_of
from .shard_cells import MAX_CELLS as MAX_CELLS  # where the page's callers read it
from .shard_cells import STATE_NAMES, ShardCells, check_start

logger = logging.getLogger(__name__)

__all__ = ["ShardBoard", "ExperiencePanel", "BranchBoard", "shard_states", "run_status", "freshness",
           "STATE_NAMES", "STATE_COLORS"]

STATE_COLORS = ["#d9d9d9", "#4c72b0", "#55a868", "#1b5e20", "#c44e52", "#dd8452"]


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
            return f"failed: {short_text(msg.get('reason') or msg.get('error') or 'unknown reason')}"
    client = start.get("client")
    if clients is not None and client and (not all_hashable(client) or client not in clients):
        return f"stale: its client {short_text(client, 80)} has left the scheduler"
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
        name, run = html.escape(short_text(start.get("name", ""))), html.escape(str(start["run"])[:12])
        self.summary.text = (f"<b>{name}</b> <code>{run}</code> "
                             f"({html.escape(status)}): {cells.n:,} shards, " + ", ".join(f"{v:,} {k}" for k, v in counts.items() if v)
                             + (f"<br>{est}" if est else "")
                             + ("<br>(the scheduler's event log dropped some of this run's events before "
                                "the page read them: counts may be low)" if self.missed else ""))


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
        papers = [html.escape(short_text(k, 80)) for k in fold.papers[:20]] + (["…"] if len(fold.papers) > 20 else [])
        stop = fold.stop
        self.summary.text = (f"run <code>{html.escape(short_text(fold.run, 80))}</code>: {len(br)} branches, "
                             f"{fold.results} results, {len(fold.pruned)} pruned, papers: {', '.join(papers) or 'none'}"
                             + (f"; stopped: {html.escape(short_text(stop))}" if stop else ""))


def _tail(values: deque, n: int) -> list:
    """The last ``n`` of ``values`` in order, in time proportional to ``n``.

    >>> _tail(deque([1, 2, 3, 4]), 2)
    [3, 4]
    """
    return list(islice(reversed(values), n))[::-1]
