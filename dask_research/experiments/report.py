"""The outcome of one scheduler run: per-branch stats, budgets, papers and the full trace.

Examples
--------
>>> from dask_research.experiments import (Hypothesis, IterationScheduler,
...                                        make_deterministic_runner)
>>> sched = IterationScheduler(make_deterministic_runner({"a": 0.9, "b": 0.1}, delay_ms=1),
...                            slots=2, progress=False)
>>> sched.add([Hypothesis(f"{b}{k}", b) for b in "ab" for k in range(3)])
>>> report = sched.run()
>>> report.stop_reason, report.total_runs, report.paper_triggers
('queue_empty', 6, ['a'])
>>> print(report)                                    # doctest: +ELLIPSIS
IterationScheduler report: queue_empty after 6 runs (0 failed) in ... s, 2 slots, occupancy ...
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .decision_trace import Trace, _jsonable
from .types import BranchStats, ExperimentResult

__all__ = ["Report"]

def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f} %"


@dataclass
class Report:
    """What :meth:`IterationScheduler.run` returns.

    Attributes
    ----------
    stop_reason : str
        ``"queue_empty"``, ``"max_experiments"`` or ``"max_seconds"``; ``"ask_tell"`` for
        the report of an unfinished ask/tell session (one whose budgets are not spent: a
        session that can ask no more says which budget stopped it).
    branches : dict of str to BranchStats
        Every branch in insertion order, as it stood when the run ended.
    total_runs : int
        Experiments that completed successfully in this run.
    dispatched : int
        Experiments started in this run (what ``max_experiments`` counts).
    failures : int
        Experiments that failed in this run.
    wall_seconds : float
        From the start of the run to the end of the drain.
    paper_triggers : list of str
        Branches that triggered the paper stage, in order.
    papers : dict
        ``{branch: what the paper writer returned}`` (``"<TypeName: message>"`` if it raised).
    events : Trace
        Every decision, in order.
    results, failed : list of Result
        Completed and failed experiments, in completion order.
    dropped : list of str
        Ids of queued hypotheses dropped by pruning.
    replayed : int
        Outcomes restored from the checkpoint instead of being run again (they are in
        ``results`` / ``failed`` and in ``total_runs`` / ``failures``, but not in
        ``dispatched``).
    objectives : dict, optional
        ``{name: "max" | "min"}`` for vector rewards.
    pareto_front : list of str
        With vector rewards: the branches whose mean reward vectors no other branch dominates
        (in branch order); :meth:`front_table` gives their means.
    policy : str
        Name of the selection policy.
    apply_order : str
        ``"completion"`` or ``"dispatch"``.
    cancelled : list of str
        Ids of experiments still in flight when ``max_seconds`` plus the cancel grace passed:
        cancelled, not counted; the next ``run()`` (or a resume) dispatches them again first.
    timed_out : list of str
        Ids of experiments that ran past the per-experiment ``timeout`` (also in ``failed``).
    objective : str
        ``"mean"`` or ``"max"``: what :attr:`best` ranks branches by.
    """

    stop_reason: str
    branches: dict[str, BranchStats]
    total_runs: int
    dispatched: int
    failures: int
    wall_seconds: float
    paper_triggers: list[str]
    papers: dict[str, Any]
    events: Trace
    results: list[ExperimentResult] = field(default_factory=list)
    failed: list[ExperimentResult] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    slots: int = 1
    run_id: str = ""
    replayed: int = 0
    objectives: dict[str, str] | None = None
    pareto_front: list[str] = field(default_factory=list)
    policy: str = "ucb1"
    apply_order: str = "completion"
    cancelled: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    objective: str = "mean"

    def front_table(self) -> list[dict[str, Any]]:
        """``[{"branch": b, "runs": n, <objective>: mean, ...}, ...]`` of the Pareto front."""
        out = []
        for b in self.pareto_front:
            s = self.branches[b]
            out.append({"branch": b, "runs": s.runs, **(s.means or {})})
        return out

    @property
    def occupancy(self) -> float:
        """Busy fraction of slot-time while work was queued (see :meth:`Trace.occupancy`)."""
        return self.events.occupancy()

    @property
    def stopped_because(self) -> str:
        """Why the run stopped, in words: ``"budget spent"`` (``max_experiments`` or
        ``max_seconds``), ``"space exhausted"`` (every queue and source ran dry; with
        ``objective="max"`` and a budget, branches the ``no-better-best`` gate pruned are
        revived first, so they are exhausted too), ``"space exhausted except pruned branches:
        ..."`` (branches still pruned, e.g. for failures or a mean below ``prune_floor``),
        or ``"ask/tell session open"``.

        >>> from dask_research.experiments import Hypothesis, IterationScheduler
        >>> sched = IterationScheduler(lambda h: 0.5, progress=False, max_experiments=1)
        >>> sched.add([Hypothesis("a1", "a"), Hypothesis("a2", "a")])
        >>> sched.run().stopped_because
        'budget spent'
        """
        if self.stop_reason in ("max_experiments", "max_seconds"):
            return "budget spent"
        if self.stop_reason == "ask_tell":
            return "ask/tell session open"
        pruned = [b for b, s in self.branches.items() if s.pruned]
        if pruned:
            return "space exhausted except pruned branches: " + ", ".join(pruned)
        return "space exhausted"

    @property
    def best(self) -> str | None:
        """Best branch under the run's objective: the highest mean (``"mean"``) or the
        highest single result (``"max"``) among branches with results; ties go to the
        earlier branch."""
        key = "best" if self.objective == "max" else "mean"
        scored = [(getattr(s, key), -i, b) for i, (b, s) in enumerate(self.branches.items())
                  if s.runs]
        return max(scored)[2] if scored else None

    @property
    def best_result(self) -> ExperimentResult | None:
        """The result with the highest (scalar) reward: the best hypothesis found, whatever
        the objective (its ``.hypothesis``; ``None`` before any result). With vector rewards,
        the highest weighted mean of the best branch's results is not defined here: ``None``."""
        if self.objectives or not self.results:
            return None
        best = self.results[0]
        for r in self.results[1:]:
            if float(r.reward) > float(best.reward):
                best = r
        return best

    def to_dict(self, events: bool = True, scores: bool = True) -> dict[str, Any]:
        """Plain dict; ``events=False`` leaves out the trace, ``scores=False`` the per-branch
        scores of ``select`` events (large with many branches)."""
        d: dict[str, Any] = {
            "run_id": self.run_id,
            "stop_reason": self.stop_reason,
            "slots": self.slots,
            "total_runs": self.total_runs,
            "dispatched": self.dispatched,
            "replayed": self.replayed,
            "policy": self.policy,
            "apply_order": self.apply_order,
            "objective": self.objective,
            "best": self.best,
            "best_hypothesis": (None if self.best_result is None
                                else self.best_result.hypothesis.id),
            "failures": self.failures,
            "wall_seconds": self.wall_seconds,
            "occupancy": self.occupancy,
            "paper_triggers": list(self.paper_triggers),
            "papers": {b: repr(p) if not isinstance(p, (str, int, float, type(None))) else p
                       for b, p in self.papers.items()},
            "dropped": list(self.dropped),
            "cancelled": list(self.cancelled),
            "timed_out": list(self.timed_out),
            "branches": {b: s.to_dict() for b, s in self.branches.items()},
            "failed": [{"id": r.hypothesis.id, "branch": r.hypothesis.branch, "error": r.error}
                       for r in self.failed],
        }
        if self.objectives:
            d["objectives"] = dict(self.objectives)
            d["pareto_front"] = self.front_table()
        if events:
            names = self.events.branches
            d["events"] = [ev.to_dict(names) if scores or (ev.scores is None and ev.top is None)
                           else {k: v for k, v in ev.to_dict(names).items()
                                 if k not in ("scores", "scores_truncated")}
                           for ev in self.events]
        return _jsonable(d)

    def to_json(self, indent: int | None = 2, events: bool = True, scores: bool = True) -> str:
        """JSON text of :meth:`to_dict` (non-finite floats as ``"inf"``/``"nan"`` strings)."""
        return json.dumps(self.to_dict(events=events, scores=scores), indent=indent)

    def _rows(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for b, s in self.branches.items():
            flags = []
            if s.pruned:
                flags.append(f"pruned ({s.pruned})")
            if s.paper_emitted:
                flags.append("paper")
            rows.append((b, str(s.runs), _fmt(s.mean), str(s.failures), str(s.queued),
                         ", ".join(flags)))
        return rows

    def __str__(self) -> str:
        head = (f"IterationScheduler report: {self.stop_reason} after {self.total_runs} runs "
                f"({self.failures} failed) in {self.wall_seconds:.3f} s, {self.slots} slots, "
                f"occupancy {_pct(self.occupancy)}")
        header = ("branch", "runs", "mean", "failed", "queued", "")
        rows = self._rows()
        limit = 20
        shown = sorted(rows, key=lambda r: -float(r[2]) if r[2] != "-" else math.inf)[:limit]
        widths = [max(len(h), *(len(r[i]) for r in shown)) if shown else len(h)
                  for i, h in enumerate(header)]
        lines = [head, "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in shown]
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more branches (best {limit} by mean shown)")
        if self.cancelled:
            lines.append(f"cancelled at the deadline ({len(self.cancelled)}, not counted): "
                         + ", ".join(self.cancelled[:20])
                         + (" ..." if len(self.cancelled) > 20 else ""))
        if self.timed_out:
            lines.append(f"timed out ({len(self.timed_out)}, counted as failed): "
                         + ", ".join(self.timed_out[:20])
                         + (" ..." if len(self.timed_out) > 20 else ""))
        if self.paper_triggers:
            lines.append("paper triggers: " + ", ".join(self.paper_triggers))
        if self.objectives:
            lines.append("Pareto front: " + ", ".join(
                f"{r['branch']} (" + ", ".join(f"{o} {_fmt(r[o])}" for o in self.objectives)
                + ")" for r in self.front_table()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Report {self.stop_reason}: {self.total_runs} runs, {len(self.branches)} "
                f"branches, {len(self.events)} events, {self.wall_seconds:.3f} s>")

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self._rows()[:50]
        )
        head = "".join(f"<th>{h}</th>" for h in ("branch", "runs", "mean", "failed", "queued",
                                                 ""))
        return (
            f"<div><strong>IterationScheduler report</strong>: "
            f"<code>{html.escape(self.stop_reason)}</code>, {self.total_runs} runs "
            f"({self.failures} failed), {self.wall_seconds:.3f} s, {self.slots} slots, "
            f"occupancy {_pct(self.occupancy)}"
            + (f"<br>Pareto front: {html.escape(', '.join(self.pareto_front))}"
               if self.objectives else "")
            + f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table></div>"
        )
