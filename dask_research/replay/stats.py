"""``plane.stats()``: a plain dict that also renders as a compact table in Jupyter, and the
counters a plane books it from.

Examples
--------
>>> s = PlaneStats({"size": 10, "capacity": 100, "inserted": 10, "sampled": 0, "tiers": []})
>>> s["size"], "<table" in s._repr_html_()
(10, True)
"""
from __future__ import annotations

import collections
import html
import math
import threading
import time
from typing import Any

import numpy as np

__all__ = ["PlaneStats", "PlaneCounters", "DeliveryStats", "STAGES"]

#: the stages of delivery, in order
STAGES = ("rate_wait", "sample", "gather", "transform", "copy")


class PlaneCounters:
    """Calls, transitions and busy seconds of a plane's ingest, sampling and priority updates.

    The plane books them under its lock; :meth:`figures` turns them into the counter part of
    ``plane.stats()``.

    >>> c = PlaneCounters()
    >>> c.sampled(8, 0.5); c.updated(3, stale=1)
    >>> f = c.figures(inserted=0)
    >>> f["sampled"], f["sample_busy_rate"], f["priority_updates"], f["stale_priority_updates"]
    (8, 16.0, 3, 1)
    """

    def __init__(self) -> None:
        self.counts = {"ingest_calls": 0, "sample_calls": 0, "sampled": 0, "ingest_s": 0.0,
                       "sample_s": 0.0, "priority_updates": 0, "stale_updates": 0}
        self.t_first: float | None = None     # time.perf_counter() of the first ingest; None: none yet
        self.t_last: float | None = None

    def ingested(self, t0: float) -> None:
        """One ingest call that started at ``t0`` (``time.perf_counter``) ends now."""
        t1 = time.perf_counter()
        cnt = self.counts
        cnt["ingest_calls"] += 1
        cnt["ingest_s"] += t1 - t0
        if self.t_first is None:
            self.t_first = t0
        self.t_last = t1

    def sampled(self, n: int, seconds: float) -> None:
        """One sampling call drew ``n`` transitions in ``seconds``."""
        cnt = self.counts
        cnt["sample_calls"] += 1
        cnt["sampled"] += n
        cnt["sample_s"] += seconds

    def updated(self, applied: int, stale: int = 0) -> None:
        """A priority update applied ``applied`` priorities and dropped ``stale``."""
        self.counts["priority_updates"] += applied
        self.counts["stale_updates"] += stale

    def figures(self, inserted: int) -> dict[str, Any]:
        """The counters and rates of ``plane.stats()`` (``inserted``: the plane's total)."""
        cnt = self.counts
        first, last = self.t_first, self.t_last
        span = last - first if first is not None and last is not None else 0.0
        nan = float("nan")
        return {
            "sampled": cnt["sampled"], "ingest_calls": cnt["ingest_calls"],
            "sample_calls": cnt["sample_calls"],
            "ingest_rate": inserted / span if span > 0 else nan,
            "ingest_busy_rate": inserted / cnt["ingest_s"] if cnt["ingest_s"] else nan,
            "sample_busy_rate": cnt["sampled"] / cnt["sample_s"] if cnt["sample_s"] else nan,
            "priority_updates": cnt["priority_updates"],
            "stale_priority_updates": cnt["stale_updates"],
        }


def _fmt(x: Any, unit: str = "", scale: float = 1.0, spec: str = ",.3g") -> str:
    try:
        v = float(x) * scale
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else f"{v:{spec}}{unit}"


class PlaneStats(dict):
    """The statistics dict of an experience plane, with ``_repr_html_`` for notebooks."""

    def _rows(self):
        yield "stored", f"{self.get('size', 0):,} of {self.get('capacity', 0):,}"
        yield "inserted / sampled", f"{self.get('inserted', 0):,} / {self.get('sampled', 0):,}"
        yield "ingest rate", _fmt(self.get("ingest_busy_rate"), " transitions/s")
        yield "sample rate", _fmt(self.get("sample_busy_rate"), " transitions/s")
        d = self.get("delivery")
        if d:
            yield "batches delivered", f"{d.get('batches', 0):,} (prefetch {d.get('prefetch')})"
            yield "exposed latency", (f"mean {_fmt(d.get('exposed_mean_s'), ' ms', 1e3)}, p99 "
                                      f"{_fmt(d.get('exposed_p99_s'), ' ms', 1e3)}")
            step = d.get("step_mean_s")
            if step:
                yield "exposed / learner step", _fmt(100 * (d.get("exposed_mean_s") or 0) / step, " %", spec=".1f")
        if self.get("priority_updates"):
            yield "priority updates", f"{self['priority_updates']:,} ({self.get('stale_priority_updates', 0):,} stale)"

    def _svg_tiers(self, width: int = 260, bar: int = 14) -> str:
        tiers = self.get("tiers") or []
        if not tiers:
            return ""
        parts = []
        for i, t in enumerate(tiers):
            frac = (t.get("used", 0) / t["rows"]) if t.get("rows") else 0.0
            y = i * (bar + 4)
            parts.append(f"<rect x='80' y='{y}' width='{width - 80}' height='{bar}' fill='#d9d9d9'/>"
                         f"<rect x='80' y='{y}' width='{(width - 80) * frac:.1f}' height='{bar}' fill='#55a868'/>"
                         f"<text x='0' y='{y + bar - 3}' font-size='11'>{html.escape(str(t.get('name')))}</text>")
        return f"<svg width='{width}' height='{len(tiers) * (bar + 4)}'>{''.join(parts)}</svg>"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in self._rows())
        return f"<div><b>Experience plane</b><table>{rows}</table>{self._svg_tiers()}</div>"


class DeliveryStats:
    """Exposed latency, learner step time and per-stage times of one :class:`BatchIterator`."""

    def __init__(self, prefetch: int, keep: int = 4096):
        self.prefetch = prefetch
        self.batches = 0
        self.first_batch_s = float("nan")
        self.exposed_s = 0.0          # after the first batch (steady state)
        self.exposed_max_s = 0.0
        self.step_s = 0.0
        self.steps = 0
        self.stage_s = dict.fromkeys(STAGES, 0.0)
        self.recent: collections.deque[float] = collections.deque(maxlen=keep)
        self.ready = 0                # batches already queued when the learner asked
        self._lock = threading.Lock()

    def record(self, exposed: float, step: float | None, info: dict[str, float],
               ready: bool = False) -> None:
        """Book one batch: ``exposed`` seconds in ``next()``, the learner's ``step`` before
        it, the stage times ``info``; ``ready``: it was waiting in the queue."""
        with self._lock:
            self.ready += ready
            if self.batches == 0:             # the cold start is reported on its own
                self.first_batch_s = exposed
            else:
                self.exposed_s += exposed
                self.exposed_max_s = max(self.exposed_max_s, exposed)
                self.recent.append(exposed)
                stage_s = self.stage_s
                for k, v in info.items():
                    if k in stage_s:
                        stage_s[k] += v
            if step is not None:
                self.step_s += step
                self.steps += 1
            self.batches += 1

    def summary(self) -> dict[str, Any]:
        """Means in seconds over the batches after the first (``first_batch_s``: the cold
        start); ``exposed_fraction`` = mean exposed latency / mean learner step."""
        with self._lock:
            n = max(self.batches - 1, 0)
            recent = np.array(self.recent) if self.recent else np.zeros(1)
            exposed_mean = self.exposed_s / n if n else float("nan")
            step_mean = self.step_s / self.steps if self.steps else float("nan")
            return {
                "batches": self.batches, "prefetch": self.prefetch, "ready": self.ready,
                "first_batch_s": self.first_batch_s,
                "exposed_mean_s": exposed_mean,
                "exposed_p50_s": float(np.percentile(recent, 50)),
                "exposed_p99_s": float(np.percentile(recent, 99)),
                "exposed_max_s": self.exposed_max_s,
                "step_mean_s": step_mean,
                "exposed_fraction": (exposed_mean / step_mean
                                     if n and self.steps and step_mean > 0 else float("nan")),
                "stages_mean_s": {k: (v / n if n else float("nan"))
                                  for k, v in self.stage_s.items()},
            }
