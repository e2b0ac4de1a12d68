"""Workloads and trace readings shared by the ``bench_experiments_*`` benchmarks.

>>> hs = hypotheses(4, 2)
>>> [(h.id, h.branch) for h in hs]
[('h0', 'b0'), ('h1', 'b1'), ('h2', 'b0'), ('h3', 'b1')]
>>> median_of([{"x": 1.0}, {"x": 3.0}, {"x": 2.0}])
{'x': 2.0}
"""
from __future__ import annotations

import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from dask_research.experiments import Hypothesis  # noqa: E402

#: the decision-overhead workload: 10,000 queued hypotheses over 1,000 branches
N_BRANCHES, N_QUEUED = 1_000, 10_000


def hypotheses(n: int, branches: int, prefix: str = "h") -> list[Hypothesis]:
    """``n`` hypotheses ``h0, h1, ...`` dealt round-robin over branches ``b0 .. b{branches-1}``."""
    return [Hypothesis(f"{prefix}{k}", f"b{k % branches}") for k in range(n)]


async def instant(h: Hypothesis) -> float:
    """A runner that returns at once: what is left is the loop's own cost."""
    return 0.5


def refill_gaps(report) -> list[float]:
    """Seconds from each result to the refill of its slot, while work was queued."""
    gaps, freed = [], {}
    for ev in report.events:
        if ev.kind in ("result", "failure") and ev.data.get("queued", 0) > 0:
            freed[ev.slot] = ev.t
        elif ev.kind == "dispatch" and ev.slot in freed:
            gaps.append(ev.t - freed.pop(ev.slot))
    return gaps


def median_of(runs: list[dict]) -> dict:
    """Figure by figure, the median over repeated runs."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}
