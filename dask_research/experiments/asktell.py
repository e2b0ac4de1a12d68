"""Ask/tell: the scheduler decides, your own loop runs the experiments.

For loops the scheduler does not drive (a notebook, an LLM agent, a batch system)::

    sched = IterationScheduler(objective="max", checkpoint="runs/search.jsonl")
    sched.add([Branch(name, propose=...) for name in families])
    for _ in range(60):
        h = sched.ask()                      # the policy's pick; counts as in flight
        sched.tell(h, my_experiment(h))      # a reward, (reward, metrics) or a Result
    report = sched.report()

``ask`` and ``tell`` go through the same ledger, policy, gates (pruning, paper trigger,
expander), journal and trace as :meth:`~.loop.IterationScheduler.run`: an ask is a ``select``
and a ``dispatch`` event (without a slot), a tell a ``result`` or ``failure``. Asks not yet
told count as experiments in flight (pending pulls), so several asks in a row spread over
branches as parallel slots do. A tell for a hypothesis that was never asked, or told twice, is
an :class:`~dask_research.exceptions.ExperimentError`, and a reward the scheduler cannot use
(outside [0, 1] with bounded rewards, ``nan``, a wrong vector, a Result of another hypothesis),
a ``duration`` that is not a finite number of seconds >= 0, or a handle that is neither a
Hypothesis nor an id is an ``InputError``; then nothing is recorded. With a checkpoint,
:meth:`~.loop.IterationScheduler.resume` continues an ask/tell session: asks that were
pending at the crash are asked again first, within the budgets, or may be told directly (even
before any ``ask``); either way each counts towards ``max_experiments`` as ``run()`` counts an
experiment it dispatches again. A paper writer runs synchronously inside the ``tell`` that
triggers it.
"""
from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

from ..exceptions import ExperimentError, InputError
from .decision_trace import _jsonable
from .execute import coerce_result
from .own_loop import run_to_end
from .report import Report
from .scheduler_run import Run
from .types import BranchStats, ExperimentResult, Hypothesis

__all__ = ["AskTellSession"]


class AskTellSession:
    """State of one ask/tell session over a :class:`~.scheduler_run.Run` (a scheduler creates it at
    its first ``ask``); ``paper_writer`` runs synchronously inside the triggering ``tell``.

    >>> from dask_research.experiments import Hypothesis, IterationScheduler
    >>> sched = IterationScheduler(None, progress=False)
    >>> sched.add([Hypothesis("h1", "a")])
    >>> h = sched.ask(); sched.tell(h, 0.7).reward
    0.7
    """

    def __init__(self, run: Run, paper_writer: Callable[..., Any] | None = None) -> None:
        self.run = run
        self.paper_writer = paper_writer
        if paper_writer is not None:
            run.on_trigger = self.write_paper
        books = run.books
        self.pending: dict[str, Hypothesis] = {}
        self.retry = books.retry            # pending at the crash: asked again first
        self.told: set[str] = {r.hypothesis.id for r in [*books.results, *books.failed]}
        self.dispatched = 0

    # -- ask ------------------------------------------------------------------------------
    def ask(self) -> Hypothesis:
        run, led, emit = self.run, self.run.ledger, self.run.recorder.emit
        if self.retry:                      # pending at the crash: asked again first, once,
            self._check_budget()            # within the budgets (as run() dispatches them)
            h = self.retry.popleft()
            emit("dispatch", h.branch, h.id, None, requeued=True)
            run.recorder.commit()
            self.pending[h.id] = h
            self.dispatched += 1            # asked again: it counts, as run() counts it
            return h
        while True:
            if not led.has_work() and not run.revive_parked(self.dispatched):
                raise ExperimentError(
                    "nothing to ask: no queued hypotheses and no live source (add "
                    "Hypothesis or Branch(name, propose=...) objects first)"
                    + (f"; {len(self.pending)} asks still wait for a tell" if self.pending
                       else ""))
            self._check_budget()
            picked = run.pick()
            if picked is None:               # the source is exhausted: decide again
                continue
            h = picked
            emit("dispatch", h.branch, h.id, None)
            run.recorder.commit()           # the decision is journaled whole before it is handed out
            self.pending[h.id] = h
            self.dispatched += 1
            return h

    def _check_budget(self) -> None:
        reason = self.run.budget_reason(self.dispatched)
        if reason is not None:
            raise ExperimentError(f"the {reason} budget is spent ({self.dispatched} asked "
                                  "in this session); raise it or read sched.report()",
                                  reason=reason)

    # -- tell -----------------------------------------------------------------------------
    def tell(self, hypothesis: Hypothesis | str, value: Any,
             duration: float | None) -> ExperimentResult:
        run = self.run
        if not isinstance(hypothesis, (str, Hypothesis)):
            raise InputError("hypothesis", hypothesis, "an asked Hypothesis or its id (a str)",
                             where="tell()")
        hid = hypothesis if isinstance(hypothesis, str) else hypothesis.id
        dur = _duration(duration, hid)
        h = self.pending.get(hid)
        if h is None:
            again = next((x for x in self.retry if x.id == hid), None)
            if again is not None:            # told directly after a resume, without a re-ask
                self.retry.remove(again)
                run.recorder.emit("dispatch", again.branch, again.id, None, requeued=True)
                self.pending[again.id] = h = again
                self.dispatched += 1         # it ran again (the user's loop ran it): it counts
        if h is None:
            if hid in self.told:
                raise ExperimentError(f"duplicate tell for hypothesis {hid!r}: its outcome was "
                                      "already recorded; tell each asked hypothesis once",
                                      id=hid)
            waiting = ", ".join(repr(k) for k in list(self.pending)[:5]) or "none"
            raise ExperimentError(f"tell for hypothesis {hid!r}, which was not asked; pending "
                                  f"asks: {waiting}", id=hid)
        if not isinstance(hypothesis, str) and (hypothesis.branch != h.branch):
            raise ExperimentError(f"tell for {hid!r} on branch {hypothesis.branch!r}, but it "
                                  f"was asked on branch {h.branch!r}", id=hid)
        s = run.settings
        objectives = tuple(s.objectives) if s.objectives else None
        if isinstance(value, ExperimentResult) and (value.hypothesis.id, value.hypothesis.branch) != (
                h.id, h.branch):
            other = value.hypothesis
            raise InputError("outcome", value, f"a Result of hypothesis {h.id!r} on branch {h.branch!r}, "
                             f"not of {other.id!r} on branch {other.branch!r}", where=f"tell({hid!r})")
        res = coerce_result(value, h, dur, s.bounded, objectives)
        if not res.ok and not (isinstance(value, ExperimentResult) and value.error is not None):
            why = res.error.split("; ", 1)[-1] if res.error else "a usable reward"
            raise InputError("reward", value, why.removeprefix("expected "), where=f"tell({hid!r})")
        del self.pending[h.id]
        self.told.add(h.id)
        try:
            run.apply(h, None, res)
        except BaseException as exc:
            run.recorder.discard(exc)       # a step an error cut short is never written
            raise
        run.recorder.commit()               # the outcome with its gates' decisions, as one step
        return res

    # -- papers and report ----------------------------------------------------------------
    def write_paper(self, branch: str, stats: BranchStats, best: ExperimentResult) -> None:
        """Run the paper writer now (there is no event loop in ask/tell)."""
        run = self.run
        try:
            out = self.paper_writer(branch, stats, best)  # type: ignore[misc]
            if inspect.isawaitable(out):
                out = _finish(out)
            run.books.paper(branch, out)
            if run.recorder.journal is not None:
                run.recorder.write({"kind": "output", "branch": branch,
                                    "output": _jsonable(out)})
            run.recorder.emit("paper.done", branch=branch)
        except Exception as exc:  # noqa: BLE001 - a failed paper never stops the session
            error = f"{type(exc).__name__}: {exc}"
            run.books.paper_failed(branch, error)
            run.recorder.emit("paper.failed", branch=branch, error=error)

    def report(self) -> Report:
        run = self.run
        journal = run.recorder.journal
        if journal is not None:
            journal.close()                 # fsync what was told; a later tell reopens it
        spent = run.budget_reason(self.dispatched)
        if spent is not None and (run.ledger.has_work() or self.retry):
            stop = spent                    # work is left, but the budget asks no more of it
        elif run.ledger.has_work() or self.pending or self.retry:
            stop = "ask_tell"
        else:
            stop = "queue_empty"
        return run.report(stop, self.dispatched)


def _duration(duration: Any, hid: str) -> float:
    """``tell``'s ``duration``: ``None`` (0.0) or a finite number of seconds >= 0."""
    if duration is None:
        return 0.0
    ok = isinstance(duration, numbers.Real) and not isinstance(duration, bool)
    if ok and math.isfinite(float(duration)) and float(duration) >= 0:
        return float(duration)
    raise InputError("duration", duration, "a finite number of seconds >= 0, or None",
                     where=f"tell({hid!r})")


async def _await(aw: Any) -> Any:
    return await aw


def _finish(aw: Any) -> Any:
    """Run an ``async def`` paper writer's awaitable to its end, here and now
    (:func:`.own_loop.run_to_end`: in a notebook, where ``asyncio.run`` refused and every such
    paper failed, on a loop of its own in a helper thread)."""
    return run_to_end(lambda: _await(aw), "paper-writer")
