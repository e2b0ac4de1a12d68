"""Audit of ask/tell misuse: budgets across a resume, the errors a bad tell gets, and a step
the journal refused (the scheduler goes no further than its journal)."""
from __future__ import annotations

import asyncio
import re

import dask
import pytest

from dask_research.exceptions import CheckpointError, ExperimentError, InputError
from dask_research.experiments import Hypothesis, IterationScheduler, Result
from dask_research.testing.experiments import resume_quietly


def hyps(n: int = 5, branches: str = "ab") -> list[Hypothesis]:
    return [Hypothesis(f"{b}{k}", b) for k in range(n) for b in branches]


def crashed_session(path, budget: int = 4, asked: int = 4, told: int = 2) -> list[str]:
    """An ask/tell session with a checkpoint that stops with ``asked - told`` asks pending
    (its journal as a killed driver leaves it); returns the pending ids."""
    sched = IterationScheduler(None, progress=False, checkpoint=path, max_experiments=budget)
    sched.add(hyps())
    hs = [sched.ask() for _ in range(asked)]
    for h in hs[:told]:
        sched.tell(h, 0.5)
    sched.close()
    return [h.id for h in hs[told:]]


resume = resume_quietly


@pytest.mark.timeout(60, method="thread")
def test_asks_again_after_a_resume_count_towards_max_experiments(tmp_path):
    """max_experiments=4: two told and two pending at the crash. The two pending are asked
    again and spend the budget; a fifth ask is refused (it used to hand out two more)."""
    path = tmp_path / "search.jsonl"
    pending = crashed_session(path)
    sched = resume(path)
    again = [sched.ask(), sched.ask()]
    assert [h.id for h in again] == pending
    for h in again:
        sched.tell(h, 0.5)
    with pytest.raises(ExperimentError, match=r"max_experiments budget is spent \(2 asked"):
        sched.ask()
    r = sched.report()
    assert r.total_runs + r.failures == 4 and r.dispatched == 2


@pytest.mark.timeout(60, method="thread")
def test_a_pending_ask_told_directly_after_a_resume_counts_too(tmp_path):
    path = tmp_path / "search.jsonl"
    pending = crashed_session(path)
    sched = resume(path)
    for hid in pending:                      # told without a re-ask: the user had the result
        sched.tell(hid, 0.5)
    with pytest.raises(ExperimentError, match="max_experiments budget is spent"):
        sched.ask()
    assert sched.report().total_runs == 4


@pytest.mark.timeout(60, method="thread")
def test_a_resumed_run_counts_the_experiments_pending_at_the_crash_too(tmp_path):
    """run() counts as ask() does: the two pending at the crash are dispatched again first
    and spend the budget (2 outcomes journaled + 2 = 4); nothing new is dispatched."""
    path = tmp_path / "search.jsonl"
    pending = crashed_session(path)
    report = resume(path, runner=lambda h: 0.5, progress=False).run()
    again = [e.hypothesis for e in report.events.of("dispatch") if not e.data.get("restored")]
    assert again == pending and all(e.data.get("requeued") for e in report.events.of("dispatch")[-2:])
    assert report.stop_reason == "max_experiments" and report.dispatched == 2 and report.total_runs == 4


@pytest.mark.timeout(60, method="thread")
def test_a_pending_ask_is_not_asked_again_past_a_lowered_budget(tmp_path):
    """Resumed with the budget lowered to what the journal already counts: run() would not
    dispatch the pending experiments again, and neither does ask()."""
    path = tmp_path / "search.jsonl"
    crashed_session(path, budget=10)
    sched = resume(path, max_experiments=2)
    with pytest.raises(ExperimentError, match="max_experiments budget is spent"):
        sched.ask()


@pytest.mark.timeout(60, method="thread")
def test_a_tell_whose_result_the_journal_refuses_stops_the_session(tmp_path):
    """A result record the journal refuses (metrics over the line cap) is counted in memory
    and not on disk: the session goes no further (it used to ask on, and a resume ran that
    experiment again while this scheduler's statistics counted it)."""
    path = tmp_path / "search.jsonl"
    with dask.config.set({"research.experiments.journal-max-line-bytes": 1500}):
        sched = IterationScheduler(None, progress=False, checkpoint=path)
        sched.add(hyps(2))
        h = sched.ask()
        with pytest.raises(CheckpointError, match="more than the 1,500 a journal line may have"):
            sched.tell(h, (0.5, {"blob": "x" * 3000}))
        for go_on in (sched.ask, lambda: sched.add(Hypothesis("z", "a"))):
            with pytest.raises(ExperimentError, match="ahead of the checkpoint; go on from the checkpoint"):
                go_on()
    sched.close()
    resumed = resume(path)
    assert [x.id for x in resumed._books.retry] == [h.id]       # runs again on resume
    assert resumed.stats[h.branch].runs == 0


@pytest.mark.timeout(120, method="thread")
def test_a_run_whose_step_the_journal_refuses_goes_no_further(tmp_path):
    """A run stopped by the journal's size cap: its decision was dropped unwritten, so a second
    run() of the same scheduler is refused (it used to go on, with the dropped decision's
    hypothesis counted in flight forever and never run)."""
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.journal-max-bytes": 2500}):
        sched = IterationScheduler(lambda h: 0.5, slots=1, progress=False, checkpoint=path)
        sched.add(hyps(3))
        with pytest.raises(CheckpointError, match="raise it and resume to go on"):
            sched.run()
        with pytest.raises(ExperimentError, match="ahead of the checkpoint; go on from the checkpoint"):
            sched.run()
    report = resume(path, runner=lambda h: 0.5, progress=False).run()
    ids = [r.hypothesis.id for r in report.results]
    assert sorted(ids) == sorted(h.id for h in hyps(3)) and len(ids) == len(set(ids))


@pytest.mark.parametrize("bad, match", [
    (float("inf"), r"tell\('a0'\): reward=inf is invalid; expected a finite number$"),
    (float("nan"), r"tell\('a0'\): reward=nan is invalid; expected a finite number$"),
    ("high", r"tell\('a0'\): reward='high' is invalid; expected a Result, a number"),
])
def test_a_bad_reward_is_one_line_naming_it_and_what_is_valid(bad, match):
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps(1, "a"))
    h = sched.ask()
    with pytest.raises(InputError, match=match) as info:
        sched.tell(h, bad)
    assert "expected expected" not in str(info.value) and "\n" not in str(info.value)
    assert sched.stats["a"].runs == 0 and sched.stats["a"].pending == 1


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), -1.0, "2s", True])
def test_a_bad_duration_is_refused_and_nothing_is_recorded(duration):
    """It used to be recorded as it was (a nan or negative duration in the report and the
    journal), or to raise float()'s bare ValueError."""
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps(1, "a"))
    h = sched.ask()
    with pytest.raises(InputError, match=r"tell\('a0'\): duration=.* is invalid; expected a finite "
                                         r"number of seconds >= 0, or None"):
        sched.tell(h, 0.5, duration=duration)
    assert sched.stats["a"].runs == 0
    assert sched.tell(h, 0.5, duration=1.5).duration == 1.5


@pytest.mark.parametrize("handle", [3, None, ["a0"]])
def test_a_handle_that_is_neither_a_hypothesis_nor_an_id_is_named(handle):
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps(1, "a"))
    sched.ask()
    with pytest.raises(InputError, match=rf"tell\(\): hypothesis={re.escape(repr(handle))} is invalid; "
                                         r"expected an asked Hypothesis or its id"):
        sched.tell(handle, 0.5)


def test_a_result_of_another_hypothesis_is_refused_not_booked_as_a_failure():
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps(2, "a"))
    h = sched.ask()
    other = Hypothesis("zz", "a")
    for outcome in (Result(other, 0.5), Result.failure(other, RuntimeError("x"))):
        with pytest.raises(InputError, match=r"expected a Result of hypothesis 'a0' on branch 'a', not of "
                                             r"'zz' on branch 'a'"):
            sched.tell(h, outcome)
    assert sched.stats["a"].failures == 0 and sched.stats["a"].pending == 1


def test_the_report_of_a_session_whose_budget_is_spent_says_which():
    """It said "ask_tell" (a session still open) while no ask was possible."""
    sched = IterationScheduler(None, progress=False, max_experiments=2)
    sched.add(hyps())
    for _ in range(2):
        sched.tell(sched.ask(), 0.5)
    r = sched.report()
    assert r.stop_reason == "max_experiments" and r.stopped_because == "budget spent"
    open_session = IterationScheduler(None, progress=False, max_experiments=3)
    open_session.add(hyps())
    open_session.tell(open_session.ask(), 0.5)
    assert open_session.report().stop_reason == "ask_tell"


@pytest.mark.timeout(60, method="thread")
def test_the_report_of_a_resumed_session_with_asks_left_to_tell_is_open(tmp_path):
    """Everything queued was asked, two asks were pending at the crash: not "queue_empty"."""
    path = tmp_path / "search.jsonl"
    sched = IterationScheduler(None, progress=False, checkpoint=path)
    sched.add(hyps(1))
    hs = [sched.ask(), sched.ask()]
    sched.close()
    resumed = resume(path)
    resumed.tell(resumed.ask(), 0.5)             # the first pending one, asked again
    assert resumed.report().stop_reason == "ask_tell"         # the second waits to be asked
    resumed.tell(hs[1].id, 0.5)
    assert resumed.report().stop_reason == "queue_empty"


def test_an_async_paper_writer_works_where_an_event_loop_runs_as_in_a_notebook():
    """ask/tell is for notebooks, where an event loop runs: an ``async def`` paper writer
    failed there with asyncio.run()'s RuntimeError, recorded as the paper."""
    async def writer(branch, stats, best):
        await asyncio.sleep(0)
        return f"paper on {branch}"

    async def cell():
        sched = IterationScheduler(None, progress=False, paper_writer=writer, paper_threshold=0.5)
        sched.add(hyps(1, "a"))
        sched.tell(sched.ask(), 0.9)
        return sched.report()

    assert asyncio.run(cell()).papers == {"a": "paper on a"}
