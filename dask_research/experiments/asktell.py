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
(outside [0, 1] with bounded rewards, ``nan``, a wrong vector) is an ``InputError``; then
nothing is recorded. With a checkpoint, :meth:`~.loop.IterationScheduler.resume` continues an
ask/tell session: asks that were pending at the crash are asked again first (or may be told
directly). A paper writer runs synchronously inside the ``tell`` that triggers it.
"""
from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from ..exceptions import ExperimentError, InputError
from .checkpoint import Journal
from .events import Trace, _jsonable
from .execute import coerce_result
from .types import BranchStats, Hypothesis, Result

if TYPE_CHECKING:
    from .loop import IterationScheduler
    from .report import Report

__all__ = ["AskTellSession"]


class AskTellSession:
    """State of one ask/tell session of a scheduler (created by the first ``ask``)."""

    def __init__(self, sched: IterationScheduler) -> None:
        self.sched = sched
        restored, sched._restored = sched._restored, None
        self.run_id = uuid.uuid4().hex[:12]
        led = sched.ledger
        sched._t0 = time.perf_counter() - (restored.elapsed if restored else 0.0)
        sched._trace = Trace(sched.slots, led.branches, started_at=time.time())
        self.results: list[Result] = []
        self.failed: list[Result] = []
        self.triggers: list[str] = []
        self.papers: dict[str, Any] = {}
        self.pending: dict[str, Hypothesis] = {}
        self.retry: deque[Hypothesis] = deque()
        self.told: set[str] = set()
        self.spent = 0
        self.dispatched = 0
        self.restored = restored
        self.retry.extend(sched._carry)     # cancelled at a run's deadline: asked again first
        sched._carry = []
        if restored is not None:
            sched._trace._events.extend(restored.events)
            self.results.extend(restored.results)
            self.failed.extend(restored.failed)
            self.triggers.extend(restored.triggers)
            self.papers.update(restored.papers)
            sched._dropped[:0] = restored.dropped
            self.retry.extend(restored.retry)
            self.spent = restored.spent
            self.told.update(r.hypothesis.id for r in [*restored.results, *restored.failed])

    # -- ask ------------------------------------------------------------------------------
    def ask(self) -> Hypothesis:
        sched, led = self.sched, self.sched.ledger
        if self.retry:                      # pending at the crash: asked again first, once
            h = self.retry.popleft()
            sched._emit("dispatch", h.branch, h.id, None, requeued=True)
            self.pending[h.id] = h
            return h
        while True:
            if not led.has_work():
                raise ExperimentError(
                    "nothing to ask: no queued hypotheses and no live source (add "
                    "Hypothesis or Branch(name, propose=...) objects first)"
                    + (f"; {len(self.pending)} asks still wait for a tell" if self.pending
                       else ""))
            reason = sched._budget_reason(self.spent + self.dispatched)
            if reason is not None:
                raise ExperimentError(f"the {reason} budget is spent ({self.dispatched} asked "
                                      "in this session); raise it or read sched.report()",
                                      reason=reason)
            picked = led.select()
            assert picked is not None
            i, scores = picked
            if not led.queued[i] and not sched._sources.propose(sched, i):
                continue                     # the source is exhausted: decide again
            h = led.pop(i)
            rng = sched.policy.rng_state()
            sched._emit("select", h.branch, h.id, None, scores, score=float(scores[i]),
                        journal=None if rng is None else {"rng": rng}, chosen=i,
                        **sched._select_data(i, h))
            sched._emit("dispatch", h.branch, h.id, None)
            self.pending[h.id] = h
            self.dispatched += 1
            return h

    # -- tell -----------------------------------------------------------------------------
    def tell(self, hypothesis: Hypothesis | str, value: Any, duration: float | None) -> Result:
        sched = self.sched
        hid = hypothesis if isinstance(hypothesis, str) else getattr(hypothesis, "id", None)
        h = self.pending.get(hid)  # type: ignore[arg-type]
        if h is None:
            h = next((x for x in self.retry if x.id == hid), None)
            if h is not None:                # told directly after a resume, without a re-ask
                self.retry.remove(h)
                sched._emit("dispatch", h.branch, h.id, None, requeued=True)
                self.pending[h.id] = h
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
        objectives = tuple(sched.objectives) if sched.objectives else None
        dur = 0.0 if duration is None else float(duration)
        res = coerce_result(value, h, dur, sched.bounded, objectives)
        if not res.ok and not (isinstance(value, Result) and value.error is not None):
            raise InputError("reward", value, res.error.split("; ", 1)[-1]  # type: ignore
                             if res.error else "a usable reward", where=f"tell({hid!r})")
        del self.pending[h.id]
        self.told.add(h.id)
        sched._on_outcome(h, None, res, self.results, self.failed, self.triggers,
                          self.papers, [], None)
        return res

    # -- papers and report ----------------------------------------------------------------
    def write_paper(self, branch: str, stats: BranchStats, best: Result) -> None:
        """Run the paper writer now (there is no event loop in ask/tell)."""
        sched = self.sched
        try:
            out = sched.paper_writer(branch, stats, best)  # type: ignore[misc]
            if inspect.isawaitable(out):
                out = asyncio.run(_await(out))
            self.papers[branch] = out
            if sched._journal is not None:
                sched._journal_write({"kind": "output", "branch": branch,
                                      "output": _jsonable(out)})
            sched._emit("paper.done", branch=branch)
        except Exception as exc:  # noqa: BLE001 - a failed paper never stops the session
            self.papers[branch] = f"<{type(exc).__name__}: {exc}>"
            sched._emit("paper.failed", branch=branch, error=f"{type(exc).__name__}: {exc}")

    def report(self) -> Report:
        from .report import Report

        sched = self.sched
        led = sched.ledger
        trace = sched._trace
        assert trace is not None
        journal: Journal | None = sched._journal
        if journal is not None:
            journal.close()                 # fsync what was told; a later tell reopens it
        return Report(
            stop_reason="ask_tell" if led.has_work() or self.pending else "queue_empty",
            branches=led.snapshot(), total_runs=len(self.results),
            dispatched=self.dispatched, failures=len(self.failed),
            wall_seconds=sched._now(), paper_triggers=list(self.triggers),
            papers=dict(self.papers), events=trace, results=list(self.results),
            failed=list(self.failed), dropped=list(sched._dropped), slots=sched.slots,
            run_id=self.run_id,
            replayed=self.restored.outcomes if self.restored is not None else 0,
            objectives=dict(sched.objectives) if sched.objectives else None,
            pareto_front=sched._pareto_front(), policy=sched.policy.name,
            apply_order=sched.apply_order, objective=sched.objective,
        )


async def _await(aw: Any) -> Any:
    return await aw
