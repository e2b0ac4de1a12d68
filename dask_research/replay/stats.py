"""``plane.stats()``: a plain dict that also renders as a compact table in Jupyter.

Examples
--------
>>> s = PlaneStats({"size": 10, "capacity": 100, "inserted": 10, "sampled": 0, "tiers": []})
>>> s["size"], "<table" in s._repr_html_()
(10, True)
"""
from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["PlaneStats"]


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
