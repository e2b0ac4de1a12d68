"""Rebuild a scheduler's state from its checkpoint journal (see :mod:`.checkpoint`).

:func:`restore` replays the journal's records, in order, through the state changes of
:class:`~.books.Books` that the live loop uses (queue, result, failure, prune, paper
trigger, paper output) and the ledger's dispatch (with the policy's hooks, so LinUCB matrices
and discounted sums come back too), and restores the generator state of randomised policies.
Nothing runs and no expander or paper writer is called: their effects are in the journal. A
record must be one the live loop writes: a result's reward passes the live loop's own check
(:func:`~.execute.coerce_result`), so a reward it would have counted as a failure is refused
even under a recomputed checksum; :func:`journaled_keywords` checks the header's settings
(:func:`~.settings.check_header`, then the constructor's own checks). The books then hold:

- the trace so far (events marked ``restored``), results, failures, triggers and papers;
- ``retry``: the experiments dispatched but without an outcome at the crash, in dispatch order;
  they stay pending in the ledger (the statistics are exactly those of the moment of the crash)
  and the scheduler dispatches them again first, once each;
- ``replayed``: outcomes already recorded (budgets count them) and ``elapsed``: seconds of the
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

import dataclasses
import math
import os
from typing import Any

from ..durable import schema
from ..exceptions import CheckpointError, ResearchError
from .books import Books
from .checkpoint import Journal, JournalState, hypothesis_from_json
from .decision_trace import EVENT_KINDS, Event
from .execute import coerce_result
from .settings import check_header
from .types import ExperimentResult, Hypothesis

__all__ = ["restore", "journaled_keywords"]

_NOT_DATA = ("seq", "t", "kind", "branch", "hypothesis", "slot", "rng", "metrics")


def _num(x: Any) -> float:
    return float(x)           # also "inf", "nan" as written by the journal


class _NotLive(ValueError):
    """A record the live loop never writes (the message says why)."""


def _outcome(e: dict, h: Hypothesis, books: Books) -> None:
    """A ``result`` or ``failure`` record, through the books.

    A result's reward passes the live loop's own check (:func:`~.execute.coerce_result`, the
    one function that decides, for ``run()`` and ``tell()``, whether a reward is a result or
    a failure): a reward the live loop would have counted as a failure (``inf``, ``nan``,
    outside [0, 1] with bounded rewards, a wrong vector) is never restored as a result.
    """
    dur = e.get("duration")
    dur = None if dur is None else _num(dur)
    if e["kind"] == "result":
        led = books.ledger
        told = ExperimentResult(h, e["reward"], dict(e.get("metrics") or {}), dur)
        res = coerce_result(told, h, 0.0, led.bounded, led.objectives or None)
        if not res.ok:
            why = (res.error or "").split("; ", 1)[-1]
            raise _NotLive(f"is a result of {h.id!r} with reward {e['reward']!r:.80}, which the live loop "
                           f"counts as a failure ({why})")
        reward = res.reward if led.dims else float(res.reward)
        books.result(dataclasses.replace(res, reward=reward, duration=dur))
    else:
        books.failure(ExperimentResult.failure(h, str(e.get("error")), dur))


def _check_seq(seq: Any, last: int | None, restored: int) -> int | None:
    """The event number ``seq`` after ``last``: the next one, ``0`` (a later run of the same
    scheduler starts its trace again) or ``restored`` (a resumed run goes on from the events
    restored before it). A record repeated, or spliced in from another journal, is none of
    these (a paper triggered twice was written twice, a dispatch seen twice ran twice)."""
    if seq is None:                                  # journals without numbers: nothing to check
        return last
    if type(seq) is not int or seq < 0:
        raise ValueError(f"event number seq={seq!r} is not an integer >= 0")
    if last is not None and seq not in (last + 1, 0, restored):
        raise ValueError(f"event number {seq} follows event {last} (expected {last + 1}): a "
                         "record repeated, or copied from another journal")
    return seq


def _triggered(branch: Any, books: Books) -> None:
    """A paper's outcome follows its branch's trigger (its writer starts there): one for a
    branch that never triggered was not written by this run."""
    if branch not in books.triggers:
        raise ValueError(f"a paper outcome for branch {branch!r}, which never triggered the paper "
                         "stage")


def _trigger(e: dict, books: Books) -> None:
    """A ``paper.trigger`` record: the branch's flag, with the result that triggered it."""
    i = books.ledger.branch_index(e["branch"])
    if books.ledger.paper[i]:
        raise ValueError(f"a second paper trigger of branch {e['branch']!r} (it triggers once "
                         "per branch)")
    hid = e.get("hypothesis")
    best = next((r for r in reversed(books.results) if r.hypothesis.id == hid), None)
    books.trigger(i, best)


def restore(state: JournalState, books: Books, where: str) -> dict[str, str]:
    """Replay ``state`` into ``books`` (fresh, on a ledger of the same policy); ``where`` names
    the file. Returns ``{hypothesis id: branch}`` of every journaled hypothesis.

    Raises :class:`CheckpointError` when the records do not fit together (a dispatch of an
    unknown hypothesis, a result without a dispatch, a duplicate id) or hold what the live loop
    never writes (a result whose reward it counts as a failure): a journal edited by hand or
    written by another program.
    """
    led = books.ledger
    ids: dict[str, str] = {}
    inflight: dict[str, Hypothesis] = {}
    last_seq: int | None = None
    for n, rec in enumerate(state.records, start=2):
        try:
            kind = rec["kind"]
            if kind == "hyps":
                batch = [hypothesis_from_json(d) for d in rec["hyps"]]
                ids.update((h.id, h.branch) for h in batch)
                books.queue(batch)
                continue
            if kind == "output":
                _triggered(rec["branch"], books)
                books.paper(str(rec["branch"]), rec.get("output"))
                continue
            e = rec["e"]
            ev_kind = e["kind"]
            if ev_kind not in EVENT_KINDS:
                raise ValueError(f"unknown event kind {ev_kind!r}")
            t = _num(e.get("t", 0.0))
            hid, branch = e.get("hypothesis"), e.get("branch")
            last_seq = _check_seq(e.get("seq"), last_seq, len(books.events))
            if ev_kind == "dispatch":
                if hid not in inflight:  # else: re-dispatch of one lost in an earlier crash
                    inflight[hid] = led.take(branch, hid)
            elif ev_kind == "select" and "rng" in e:
                led.policy.set_rng_state(e["rng"])
            elif ev_kind in ("result", "failure"):
                h = inflight.pop(hid, None)
                if h is None:
                    raise ValueError(f"{ev_kind} of {hid!r}, which was not in flight")
                _outcome(e, h, books)
            elif ev_kind == "prune":
                i = led.branch_index(branch)
                if led.pruned[i]:
                    raise ValueError(f"a prune of branch {branch!r}, which is pruned already")
                books.prune(i, str(e.get("reason")))
            elif ev_kind == "revive":
                i = led.branch_index(branch)
                if not led.pruned[i]:
                    raise ValueError(f"a revive of branch {branch!r}, which is not pruned")
                books.revive(i, live=False)
            elif ev_kind == "paper.trigger":
                _trigger(e, books)
            elif ev_kind == "paper.failed":
                _triggered(branch, books)
                books.paper_failed(branch, str(e.get("error")))
            data = {k: v for k, v in e.items() if k not in _NOT_DATA}
            data["restored"] = True
            books.events.append(Event(len(books.events), t, ev_kind, branch, hid,
                                      e.get("slot"), data, None))
            books.elapsed = max(books.elapsed, t)
        except CheckpointError:
            raise
        except _NotLive as exc:
            raise CheckpointError(where, f"record {n} {exc}; the journal was edited (its checksum "
                                         "recomputed) or written by another program") from None
        except (KeyError, TypeError, ValueError, IndexError, ResearchError) as exc:
            raise CheckpointError(where, f"record {n} does not fit the state before it "
                                         f"({type(exc).__name__}: {exc}); the journal is "
                                         "corrupt or belongs to another run") from None
    books.retry.extend(inflight.values())
    books.replayed = books.outcomes
    if not math.isfinite(books.elapsed):
        books.elapsed = 0.0
    return ids


def journaled_keywords(path: str | os.PathLike[str], overrides: dict[str, Any]) -> dict[str, Any]:
    """The scheduler settings recorded in the header of the journal at ``path``, updated with
    ``overrides``; :class:`CheckpointError` when there is no journal, when it needs a custom
    policy passed again, or when a journaled setting (one not overridden) is not one the header
    is written with, of its JSON type (:func:`~.settings.check_header`; its value is then checked
    by the constructor, as a keyword)."""
    journal = Journal(path)
    state = journal.load(lazy=True)               # the header's settings only
    where = journal.url
    if state is None:
        raise CheckpointError(where, "does not exist or is empty; nothing to resume (start "
                                     "a run with IterationScheduler(..., checkpoint=path))")
    header = {k: v for k, v in state.settings.items() if k not in overrides}
    try:
        check_header(header)
    except schema.Invalid as exc:
        what = f"its header's setting {exc}" if exc.where else f"its header {exc.problem}"
        raise CheckpointError(where, f"{what}; the file is damaged or was edited") from None
    if header.get("policy") == "custom":
        raise CheckpointError(where, "was written with a custom policy object or function; "
                                     "pass it again: IterationScheduler.resume(path, runner, "
                                     "policy=my_policy)")
    return {**{k: v for k, v in header.items() if v is not None}, **overrides}
