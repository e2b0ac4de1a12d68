"""The scheduler's parts on their own: settings, books, gates, recorder, run and the resume replay."""
import math

import pytest

from dask_research.exceptions import ExperimentError, InputError
from dask_research.experiments import (
    ExperimentResult,
    Hypothesis,
    IterationScheduler,
    make_deterministic_runner,
    make_followup_expander,
    make_policy,
)
from dask_research.experiments.books import Books
from dask_research.experiments.checkpoint import Journal
from dask_research.experiments.gates import paper_gate, prune_gate
from dask_research.experiments.ledger import BranchLedger
from dask_research.experiments.recorder import Recorder, log_records
from dask_research.experiments.resume import journaled_keywords, restore
from dask_research.experiments.settings import SchedulerSettings, check_functions

STATE_CHANGES = ("queue", "result", "failure", "prune", "trigger", "paper", "paper_failed")


def _hyps(branches, n):
    return [Hypothesis(f"{b}{k}", b) for k in range(n) for b in branches]


# -- settings --------------------------------------------------------------------------------
def test_settings_header_rebuilds_the_same_settings():
    s = SchedulerSettings.parse(slots=3, c=0.5, policy="kl-ucb", objectives=None,
                                max_experiments=7, timeout=2.0, apply_order="dispatch")
    again = SchedulerSettings.parse(**s.header())
    assert again == s
    assert s.make_policy().name == "kl-ucb"


def test_settings_reject_what_the_scheduler_rejected():
    with pytest.raises(InputError, match="apply_order"):
        SchedulerSettings.parse(apply_order="random")
    with pytest.raises(InputError, match="checkpoint"):
        SchedulerSettings.parse(checkpoint=3)
    with pytest.raises(InputError, match="objective"):
        SchedulerSettings.parse(objective="max", objectives={"a": "max", "b": "min"})
    with pytest.raises(ExperimentError, match="expander must be a plain function"):
        async def expand(result):
            return []
        check_functions(None, expand, None)


def test_scheduler_settings_are_attributes_of_the_scheduler():
    sched = IterationScheduler(lambda h: 0.5, slots=2, progress=False)
    sched.timeout = 1.5
    assert sched.settings.timeout == 1.5 and sched.slots == sched.settings.slots == 2


# -- books and gates -------------------------------------------------------------------------
def test_books_count_what_the_report_shows():
    books = Books(BranchLedger(c=1.0))
    assert books.queue(_hyps("ab", 2)) == []
    led = books.ledger
    i = books.result(ExperimentResult(led.pop(0), 0.9))
    j = books.failure(ExperimentResult.failure(led.pop(1), "ValueError: x"))
    books.trigger(i, books.results[-1])
    books.paper_failed("a", "OSError: disk")
    assert books.prune(j, "failures") == [Hypothesis("b1", "b")]
    assert books.outcomes == 2 and books.triggers == ["a"] and books.dropped == ["b1"]
    assert books.papers == {"a": "<OSError: disk>"} and bool(led.paper[i])
    assert books.restored_outcomes() == []          # nothing was replayed


def test_gates_for_the_three_objectives():
    led = BranchLedger(c=1.0)
    led.add(_hyps("a", 3))
    for _ in range(3):
        led.record(ExperimentResult(led.pop(0), 0.1))
    mean = SchedulerSettings.parse(prune_floor=0.2, prune_after_runs=3, paper_threshold=0.05)
    assert prune_gate(mean, led, 0, None) == "low-mean"
    assert paper_gate(mean, led, 0)
    vec = BranchLedger(c=1.0, objectives=[("acc", "max"), ("cost", "min")])
    vec.add(_hyps("v", 1))
    vec.record(ExperimentResult(vec.pop(0), (0.9, 0.8)))
    floors = SchedulerSettings.parse(objectives={"acc": "max", "cost": "min"},
                                     prune_floor={"cost": 0.5}, prune_after_runs=1)
    assert prune_gate(floors, vec, 0, None) == "low-cost"
    best = SchedulerSettings.parse(objective="max", paper_threshold=0.05)
    assert prune_gate(best, led, 0, None) is None      # the holder of the best is kept
    assert paper_gate(best, led, 0)


# -- recorder ----------------------------------------------------------------------------------
def test_recorder_bounds_scores_and_log_records_keep_32():
    import numpy as np

    led = BranchLedger(c=1.0)
    led.add([Hypothesis(f"h{k}", f"b{k}") for k in range(40)])
    rec = Recorder(slots=1, trace_scores=5, ledger=led)
    trace = rec.begin([], 10.0)
    rec.emit("select", "b3", "h3", None, np.arange(40.0), chosen=3, score=3.0)
    (ev,) = trace
    assert ev.scores is None and len(ev.top) == 5 and ev.scored == 40 and ev.t >= 10.0
    (d,) = log_records(trace, 0, "r")
    assert d["event"] == "select" and d["run"] == "r" and len(d["scores"]) == 5


# -- one validation per batch ------------------------------------------------------------------
def test_a_batch_is_validated_once(monkeypatch, tmp_path):
    calls = []
    real = BranchLedger._check_ids

    def counting(hypotheses, seen):
        batch = real(hypotheses, seen)
        calls.append(len(batch))
        return batch

    monkeypatch.setattr(BranchLedger, "_check_ids", staticmethod(counting))
    sched = IterationScheduler(make_deterministic_runner({"a": 0.9}, delay_ms=0), slots=1,
                               progress=False, checkpoint=str(tmp_path / "j.jsonl"),
                               expander=make_followup_expander(threshold=0.5, fanout=2,
                                                               max_generation=1))
    sched.add(_hyps("a", 2))
    assert calls == [2]                              # add(): once
    report = sched.run()
    expanded = [e for e in report.events.of("expand") if e.data["ids"]]
    # once each (an expander that returns nothing is checked as an empty batch)
    assert expanded and [n for n in calls[1:] if n] == [len(e.data["ids"]) for e in expanded]


# -- resume goes through the same state changes ------------------------------------------------
def _spy(monkeypatch):
    seen = []
    for name in STATE_CHANGES:
        real = getattr(Books, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            seen.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Books, name, spy)
    return seen


def test_resume_replays_the_journal_through_the_live_state_changes(monkeypatch, tmp_path):
    path = str(tmp_path / "loop.jsonl")

    def runner(h):
        if h.id.startswith("c"):
            raise ValueError("broken")
        return {"a": 0.9, "b": 0.1}[h.branch]

    def writer(branch, stats, best):
        return f"paper on {branch}"

    live = _spy(monkeypatch)
    sched = IterationScheduler(runner, slots=2, progress=False, checkpoint=path,
                               prune_floor=0.2, prune_after_runs=2, paper_threshold=0.5,
                               failure_limit=2, paper_writer=writer)
    sched.add(_hyps("abc", 4))
    report = sched.run()
    assert {"queue", "result", "failure", "prune", "trigger", "paper"} <= set(live)
    recorded = list(live)
    live.clear()
    books = Books(BranchLedger(sched.c, make_policy("ucb1", c=sched.c)))
    restore(Journal(path).load(), books, path)
    assert live == recorded                          # the same changes, in the same order
    assert books.ledger.snapshot() == report.branches
    assert books.papers == report.papers and books.triggers == report.paper_triggers
    assert sorted(books.dropped) == sorted(report.dropped)


def test_journaled_keywords_merge_overrides_and_refuse_unknown_ones(tmp_path):
    path = str(tmp_path / "loop.jsonl")
    sched = IterationScheduler(lambda h: 0.5, slots=2, progress=False, checkpoint=path,
                               max_experiments=1)
    sched.add(_hyps("a", 2))
    sched.run()
    sched.close()
    kw = journaled_keywords(path, {"max_experiments": None})
    assert kw["slots"] == 2 and kw["max_experiments"] is None
    assert math.isfinite(kw["c"])
    with pytest.raises(InputError, match="slotz=3 is invalid; expected one of the scheduler's settings"):
        IterationScheduler.resume(path, lambda h: 0.5, slotz=3)
