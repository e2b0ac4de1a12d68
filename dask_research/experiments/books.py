"""The books of a run: what the next report counts, and the state changes that count it.

Every change an outcome makes to the scheduler's state goes through one method of
:class:`Books` (queue, result, failure, prune, paper trigger, paper output). The live loop and
ask/tell call them when a gate decides; :func:`~.resume.restore` calls the *same* methods for
the journal's records, so a resumed run cannot drift from a live one, and a new gate's effect
is written once.

Examples
--------
>>> from dask_research.experiments import Hypothesis, Result
>>> from dask_research.experiments.books import Books
>>> from dask_research.experiments.ledger import BranchLedger
>>> books = Books(BranchLedger(c=1.0))
>>> books.queue([Hypothesis("a1", "a"), Hypothesis("a2", "a")])
[]
>>> i = books.result(Result(books.ledger.pop(0), 0.9))
>>> [h.id for h in books.prune(i, "manual")]
['a2']
>>> [r.hypothesis.id for r in books.results], books.dropped
(['a1'], ['a2'])
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from .decision_trace import Event
from .ledger import BranchLedger
from .types import ExperimentResult, Hypothesis

__all__ = ["Books"]


class Books:
    """Results, failures, prunes, paper triggers and papers of one report, on one ledger.

    After :func:`~.resume.restore` they also hold what the journal held: ``events`` (the
    trace so far), ``retry`` (experiments in flight at the crash, in dispatch order),
    ``replayed`` (outcomes already counted) and ``elapsed`` (seconds of the trace so far).
    """

    def __init__(self, ledger: BranchLedger, retry: Iterable[Hypothesis] = ()) -> None:
        self.ledger = ledger
        self.results: list[ExperimentResult] = []
        self.failed: list[ExperimentResult] = []
        self.triggers: list[str] = []
        self.trigger_results: dict[str, ExperimentResult] = {}
        self.papers: dict[str, Any] = {}
        self.dropped: list[str] = []
        self.retry: deque[Hypothesis] = deque(retry)
        self.events: list[Event] = []
        self.replayed = 0
        self.elapsed = 0.0
        self.live = False          # a run or ask/tell session has started on these books

    @property
    def outcomes(self) -> int:
        """Results and failures counted so far."""
        return len(self.results) + len(self.failed)

    def restored_outcomes(self) -> list[ExperimentResult]:
        """The outcomes read from the journal, until a run starts (sources learn from them)."""
        if self.live or not self.replayed:
            return []
        return [*self.results, *self.failed]

    # -- the state changes -------------------------------------------------------------------
    def queue(self, batch: list[Hypothesis], checked: bool = False) -> list[Hypothesis]:
        """Queue ``batch`` (``checked``: already validated); returns those dropped because
        their branch is pruned."""
        dropped = self.ledger.add(batch, checked=checked)
        self.dropped.extend(h.id for h in dropped)
        return dropped

    def result(self, res: ExperimentResult) -> int:
        """Count a successful result; returns its branch index."""
        i = self.ledger.record(res)
        self.results.append(res)
        return i

    def failure(self, res: ExperimentResult) -> int:
        """Count a failed experiment; returns its branch index."""
        i = self.ledger.record_failure(res.hypothesis)
        self.failed.append(res)
        return i

    def prune(self, i: int, reason: str) -> list[Hypothesis]:
        """Prune branch ``i``; returns its dropped queued hypotheses."""
        dropped = self.ledger.prune(i, reason)
        self.dropped.extend(d.id for d in dropped)
        return dropped

    def revive(self, i: int, live: bool) -> None:
        """Bring pruned branch ``i`` back; ``live``: its source proposes again (on resume the
        source is registered later and marks itself live)."""
        self.ledger.revive(i)
        self.ledger.set_sourced(i, live)

    def trigger(self, i: int, best: ExperimentResult | None) -> None:
        """Branch ``i`` triggered the paper stage with result ``best``."""
        branch = self.ledger.branches[i]
        self.ledger.paper[i] = True
        self.triggers.append(branch)
        if best is not None:
            self.trigger_results[branch] = best

    def paper(self, branch: str, output: Any) -> None:
        """The paper writer of ``branch`` returned ``output``."""
        self.papers[branch] = output

    def paper_failed(self, branch: str, error: str) -> None:
        """The paper writer of ``branch`` raised (``error``: ``"TypeName: message"``)."""
        self.papers[branch] = f"<{error}>"
