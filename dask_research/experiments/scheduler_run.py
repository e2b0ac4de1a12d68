"""One run of a scheduler: the decisions and the books of the loop or of an ask/tell session.

:class:`Run` is what :mod:`.driver` (the asyncio loop) and :mod:`.asktell` share: it picks the
next hypothesis (:meth:`Run.pick`), applies an outcome and the gates (:meth:`Run.apply`:
count it, prune, trigger the paper stage, expand) and builds the :class:`~.report.Report`.
It holds no clock and no I/O of its own: events go to the :class:`~.recorder.Recorder`,
state changes to the :class:`~.books.Books`.

Examples
--------
>>> from dask_research.experiments import Hypothesis, IterationScheduler
>>> sched = IterationScheduler(None, progress=False, prune_floor=0.2, prune_after_runs=1)
>>> sched.add([Hypothesis("a1", "a"), Hypothesis("a2", "a")])
>>> h = sched.ask()                   # an ask/tell session drives a Run
>>> _ = sched.tell(h, 0.1)            # below the floor after one run: pruned
>>> report = sched.report()
>>> report.branches["a"].pruned, report.dropped
('low-mean', ['a2'])
"""
from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from . import gates
from .books import Books
from .checkpoint import hypothesis_to_json
from .decision_trace import _jsonable
from .ledger import BranchLedger
from .policies.pareto import pareto_front
from .recorder import Recorder
from .report import Report
from .settings import SchedulerSettings
from .sources import Intake, SourceTable
from .types import BranchStats, ExperimentResult, Hypothesis

__all__ = ["Run", "pareto_branches"]


class Run:
    """The decisions of one run over the scheduler's ledger, recorder and sources.

    ``on_trigger(branch, stats, best)`` starts the paper writer (the loop runs it as a task,
    ask/tell at once); ``expander(result) -> hypotheses`` queues follow-ups through ``queue``.
    """

    def __init__(self, settings: SchedulerSettings, books: Books, recorder: Recorder,
                 sources: SourceTable, queue: Intake,
                 expander: Callable[[ExperimentResult], Any] | None = None) -> None:
        self.settings = settings
        self.books = books
        self.ledger: BranchLedger = books.ledger
        self.recorder = recorder
        self.sources = sources
        self.queue = queue
        self.expander = expander
        self.on_trigger: Callable[[str, BranchStats, ExperimentResult], None] | None = None
        self.run_id = uuid.uuid4().hex[:12]
        self.spent = books.replayed          # outcomes the budgets already count
        books.live = True
        self.trace = recorder.begin(books.events, books.elapsed)

    # -- deciding ------------------------------------------------------------------------
    def budget_reason(self, dispatched: int) -> str | None:
        """The budget that stops dispatching after ``dispatched`` more experiments, if any."""
        s = self.settings
        if s.max_experiments is not None and self.spent + dispatched >= s.max_experiments:
            return "max_experiments"
        if s.max_seconds is not None and self.recorder.now() >= s.max_seconds:
            return "max_seconds"
        return None

    def revive_parked(self, dispatched: int) -> bool:
        """With ``objective="max"``, a budget given and left, and nothing else to run: bring
        back every branch the ``"no-better-best"`` gate pruned whose source is registered
        (``revive`` events); ``True`` if any came back. That gate is a statistical guess
        about which branch can still beat the best; once the live branches are exhausted, the
        budget buys more of the pruned ones rather than stopping early. Returns ``False``
        when there is nothing to revive: then the space is exhausted."""
        s, led = self.settings, self.ledger
        if (s.objective != "max" or (s.max_experiments is None and s.max_seconds is None)
                or self.budget_reason(dispatched) is not None):
            return False
        back = [i for i, why in sorted(led.prune_reasons.items())
                if why == "no-better-best" and led.branches[i] in self.sources.by_branch]
        for i in back:
            self.books.revive(i, live=True)
            self.recorder.emit("revive", led.branches[i], reason="budget-left",
                               pruned="no-better-best", runs=int(led.runs[i]))
        return bool(back)

    def pick(self) -> Hypothesis | None:
        """The policy's next hypothesis, taken from its queue and recorded (``select``);
        ``None`` when the picked branch's source is exhausted (decide again). Call only
        while the ledger has work."""
        led = self.ledger
        picked = led.select()
        assert picked is not None
        i, scores = picked
        if not led.queued[i] and not self.sources.propose(led, i, self.queue,
                                                          self.recorder.emit):
            return None
        h = led.pop(i)
        pol = led.policy
        if pol.picks_hypothesis:
            extra: dict[str, Any] = {"position": pol.position}
        else:
            front = getattr(pol, "last_front", None)
            extra = ({"front": [led.branches[j] for j in np.flatnonzero(front)]}
                     if front is not None and len(front) else {})
        rng = pol.rng_state()
        self.recorder.emit("select", h.branch, h.id, None, scores, score=float(scores[i]),
                           journal=None if rng is None else {"rng": rng}, chosen=i, **extra)
        return h

    # -- an outcome and the gates ----------------------------------------------------------
    def apply(self, h: Hypothesis, slot: int | None, outcome: Any) -> None:
        """Count ``outcome`` (a Result, or what a failed experiment raised), then apply the
        gates in order: pruning, paper trigger, expansion."""
        led, books, emit = self.ledger, self.books, self.recorder.emit
        ok = isinstance(outcome, ExperimentResult) and outcome.ok
        if ok:
            res: ExperimentResult = outcome
            i = books.result(res)
            runs, mean = int(led.runs[i]), float(led.mean[i])
            vec: dict[str, Any] = {"means": led.raw_means(i)} if led.dims else {}
            emit("result", h.branch, h.id, slot, reward=res.reward, duration=res.duration,
                 mean=mean, runs=runs, journal={"metrics": _jsonable(res.metrics)}, **vec)
        else:
            res = (outcome if isinstance(outcome, ExperimentResult)
                   else ExperimentResult.failure(h, outcome))
            i = books.failure(res)
            runs = int(led.runs[i])
            mean = float(led.mean[i]) if runs else math.nan
            emit("failure", h.branch, h.id, slot, error=res.error,
                 failures=int(led.failures[i]), journal={"duration": res.duration})
        if self.sources.by_branch:
            self.sources.observe(res, led, emit)
        means = led.raw_means(i)
        vector: dict[str, Any] = {"means": means} if means else {}
        # gate 1: pruning
        if not led.pruned[i]:
            reason = gates.prune_gate(self.settings, led, i, self.trace)
            if reason is not None:
                dropped = books.prune(i, reason)
                emit("prune", h.branch, reason=reason, mean=mean, runs=runs,
                     failures=int(led.failures[i]), dropped=[d.id for d in dropped], **vector)
                return
        if not ok or led.pruned[i]:
            return
        # gate 2: paper trigger, once per branch
        if gates.paper_gate(self.settings, led, i):
            books.trigger(i, res)
            emit("paper.trigger", h.branch, h.id, mean=mean, runs=runs,
                 threshold=self.settings.paper_threshold, **vector)
            if self.on_trigger is not None:
                self.on_trigger(h.branch, led.stats(i), res)
        # gate 3: expansion
        if self.expander is not None:
            self._expand(res)

    def _expand(self, result: ExperimentResult) -> None:
        h = result.hypothesis
        emit = self.recorder.emit
        try:
            new = list(self.expander(result))  # type: ignore[misc]
            wrong = [x.id for x in new if isinstance(x, Hypothesis) and x.branch != h.branch]
            batch = self.ledger.validate(new)
            encoded = ([hypothesis_to_json(x) for x in batch]
                       if self.recorder.journal is not None else None)
        except Exception as exc:  # noqa: BLE001 - a faulty expander must not kill the loop
            emit("expand", branch=h.branch, hypothesis=h.id, ids=[],
                 error=f"{type(exc).__name__}: {exc}")
            return
        if not batch:
            return
        self.queue(batch, encoded, True)
        other: dict[str, Any] = {"other_branches": wrong} if wrong else {}
        emit("expand", branch=h.branch, hypothesis=h.id, ids=[x.id for x in batch], **other)

    # -- the report ------------------------------------------------------------------------
    def report(self, stop_reason: str, dispatched: int, **extra: Any) -> Report:
        """The :class:`~.report.Report` of the books so far (``extra``: ``cancelled``,
        ``timed_out``)."""
        s, led, books = self.settings, self.ledger, self.books
        return Report(
            stop_reason=stop_reason, branches=led.snapshot(), total_runs=len(books.results),
            dispatched=dispatched, failures=len(books.failed), wall_seconds=self.recorder.now(),
            paper_triggers=list(books.triggers), papers=dict(books.papers), events=self.trace,
            results=list(books.results), failed=list(books.failed),
            dropped=list(books.dropped), slots=s.slots, run_id=self.run_id,
            replayed=books.replayed, objectives=dict(s.objectives) if s.objectives else None,
            pareto_front=pareto_branches(led), policy=led.policy.name,
            apply_order=s.apply_order, objective=s.objective, **extra)


def pareto_branches(led: BranchLedger) -> list[str]:
    """Branches whose mean reward vectors no other branch dominates (vector rewards; ``[]``
    for scalar ones).

    >>> pareto_branches(BranchLedger(c=1.0))
    []
    """
    if not led.dims:
        return []
    k = len(led.branches)
    mask = pareto_front(led.vector_means(), led.runs[:k] > 0)
    return [led.branches[j] for j in np.flatnonzero(mask)]
