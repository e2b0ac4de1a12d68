"""Rebuild a scheduler's state from its checkpoint journal (see :mod:`.checkpoint`).

:func:`restore` replays the journal's records, in order, into a fresh
:class:`~.ledger.BranchLedger`: queued hypotheses, dispatches (with the policy's hooks, so
LinUCB matrices and discounted sums come back too), results and failures, prunes, paper flags
and the generator state of randomised policies. Nothing runs and no expander or paper writer is
called: their effects are in the journal. What comes out is a :class:`Restored`:

- the trace so far (events marked ``restored``), results, failures, triggers and papers;
- ``retry``: the experiments dispatched but without an outcome at the crash, in dispatch order;
  they stay pending in the ledger (the statistics are exactly those of the moment of the crash)
  and the scheduler dispatches them again first, once each;
- ``spent``: outcomes already recorded (budgets count them) and ``elapsed``: seconds of the
  trace so far (``max_seconds`` counts them).

Examples
--------
>>> import os, tempfile
>>> from dask_research.experiments import Hypothesis, IterationScheduler
>>> path = os.path.join(tempfile.mkdtemp(), "loop.jsonl")
>>> sched = IterationScheduler(lambda h: 0.5, slots=1, progress=False, checkpoint=path,
...                            max_experiments=2)
>>> sched.add([Hypothesis(f"h{k}", "a") for k in range(4)])
>>> sched.run().total_runs
2
>>> again = IterationScheduler.resume(path, lambda h: 0.5, max_experiments=None)
>>> again.stats["a"].runs, again.stats["a"].queued
(2, 2)
>>> report = again.run()
>>> report.total_runs, report.replayed, report.dispatched
(4, 2, 2)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import CheckpointError, ResearchError
from .checkpoint import JournalState, hypothesis_from_json
from .events import EVENT_KINDS, Event
from .ledger import BranchLedger
from .types import Hypothesis, Result

__all__ = ["Restored", "restore"]


@dataclass
class Restored:
    """State rebuilt from a journal (what the first run after a restore starts from)."""

    events: list[Event] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    failed: list[Result] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    trigger_results: dict[str, Result] = field(default_factory=dict)
    papers: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    retry: list[Hypothesis] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)          # hypothesis id -> branch
    spent: int = 0
    elapsed: float = 0.0

    @property
    def outcomes(self) -> int:
        return len(self.results) + len(self.failed)


def _num(x: Any) -> float:
    if isinstance(x, str):
        return float(x)           # "inf", "nan" as written by the journal
    return float(x)


def _reward(x: Any, vector: bool) -> Any:
    if vector:
        if not isinstance(x, list):
            raise ValueError(f"expected a reward vector, got {x!r}")
        return tuple(_num(v) for v in x)
    return _num(x)


def restore(state: JournalState, ledger: BranchLedger, where: str) -> Restored:
    """Replay ``state`` into ``ledger`` (fresh, of the same policy); ``where`` names the file.

    Raises :class:`CheckpointError` when the records do not fit together (a dispatch of an
    unknown hypothesis, a result without a dispatch, a duplicate id): a journal edited by hand
    or written by another program.
    """
    out = Restored()
    inflight: dict[str, Hypothesis] = {}
    hyps: dict[str, Hypothesis] = {}
    vector = bool(ledger.dims)
    for n, rec in enumerate(state.records, start=2):
        try:
            kind = rec["kind"]
            if kind == "hyps":
                batch = [hypothesis_from_json(d) for d in rec["hyps"]]
                for h in batch:
                    hyps[h.id] = h
                    out.ids[h.id] = h.branch
                out.dropped.extend(h.id for h in ledger.add(batch))
                continue
            if kind == "output":
                out.papers[str(rec["branch"])] = rec.get("output")
                continue
            e = rec["e"]
            ev_kind = e["kind"]
            if ev_kind not in EVENT_KINDS:
                raise ValueError(f"unknown event kind {ev_kind!r}")
            t = _num(e.get("t", 0.0))
            hid, branch = e.get("hypothesis"), e.get("branch")
            if ev_kind == "dispatch":
                if hid in inflight:      # re-dispatch of an experiment lost in an earlier crash
                    pass
                else:
                    inflight[hid] = ledger.take(branch, hid)
            elif ev_kind == "select" and "rng" in e:
                ledger.policy.set_rng_state(e["rng"])
            elif ev_kind in ("result", "failure"):
                h = inflight.pop(hid, None)
                if h is None:
                    raise ValueError(f"{ev_kind} of {hid!r}, which was not in flight")
                dur = e.get("duration")
                dur = None if dur is None else _num(dur)
                if ev_kind == "result":
                    res = Result(h, _reward(e["reward"], vector), dict(e.get("metrics") or {}),
                                 dur)
                    ledger.record(res)
                    out.results.append(res)
                else:
                    res = Result.failure(h, str(e.get("error")), dur)
                    ledger.record_failure(h)
                    out.failed.append(res)
            elif ev_kind == "prune":
                i = ledger.branch_index(branch)
                dropped = ledger.prune(i, str(e.get("reason")))
                out.dropped.extend(d.id for d in dropped)
            elif ev_kind == "paper.trigger":
                i = ledger.branch_index(branch)
                ledger.paper[i] = True
                out.triggers.append(branch)
                last = next((r for r in reversed(out.results) if r.hypothesis.id == hid), None)
                if last is not None:
                    out.trigger_results[branch] = last
            elif ev_kind == "paper.failed":
                out.papers[branch] = f"<{e.get('error')}>"
            data = {k: v for k, v in e.items()
                    if k not in ("seq", "t", "kind", "branch", "hypothesis", "slot", "rng",
                                 "metrics")}
            data["restored"] = True
            out.events.append(Event(len(out.events), t, ev_kind, branch, hid, e.get("slot"),
                                    data, None))
            out.elapsed = max(out.elapsed, t)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, ResearchError) as exc:
            raise CheckpointError(where, f"record {n} does not fit the state before it "
                                         f"({type(exc).__name__}: {exc}); the journal is "
                                         "corrupt or belongs to another run") from None
    out.retry = list(inflight.values())
    out.spent = out.outcomes
    if not math.isfinite(out.elapsed):
        out.elapsed = 0.0
    return out
