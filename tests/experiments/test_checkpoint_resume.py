"""Crash-safe resume: the journal replays finished experiments instead of running them again."""
import json

import pytest

from dask_research.exceptions import CheckpointError
from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    deterministic_expander,
    make_deterministic_runner,
)
from dask_research.experiments.checkpoint import Journal

from exp_scenarios import summary

REWARDS = {"strong": 0.9, "mid": 0.5, "weak": 0.1}


class CountingRunner:
    def __init__(self):
        self.inner = make_deterministic_runner(REWARDS, delay_ms=1, fail={"broken"})
        self.calls = []

    async def __call__(self, h):
        self.calls.append(h.id)
        return await self.inner(h)


def _scheduler(runner, path, **kw):
    papers = kw.pop("papers", [])

    def writer(branch, stats, best):
        papers.append(branch)
        return f"paper on {branch}"

    sched = IterationScheduler(runner, slots=1, progress=False, checkpoint=path,
                               expander=deterministic_expander, paper_writer=writer,
                               failure_limit=2, **kw)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(4)
               for b in ("strong", "mid", "weak", "broken")])
    return sched


def test_resume_replays_the_journal_and_finishes_like_one_run(tmp_path):
    whole = _scheduler(CountingRunner(), None).run()

    path = tmp_path / "runs" / "loop.jsonl"
    first_runner, papers = CountingRunner(), []
    first = _scheduler(first_runner, path, max_experiments=7, papers=papers).run()
    assert first.stop_reason == "max_experiments" and len(first_runner.calls) == 7
    assert papers == ["strong"]

    second_runner, papers_again = CountingRunner(), []
    second = _scheduler(second_runner, path, papers=papers_again).run()
    assert second.replayed == 7 and second.dispatched == len(whole.results) + len(
        whole.failed) - 7
    assert not set(second_runner.calls) & set(first_runner.calls)      # nothing ran twice
    assert papers_again == [] and second.papers == {"strong": "paper on strong"}
    # decisions, statistics, prunes, follow-ups and papers equal those of the run in one go
    assert summary(second) == summary(whole)
    replays = [e for e in second.events.of("result", "failure") if e.data.get("replayed")]
    assert len(replays) == 7 and all(e.slot is None for e in replays)

    third_runner = CountingRunner()
    third = _scheduler(third_runner, path).run()                        # all in the journal
    assert third_runner.calls == [] and third.dispatched == 0
    assert summary(third) == summary(whole)


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "loop.jsonl"
    runner = CountingRunner()
    _scheduler(runner, path, max_experiments=3).run()
    with open(path, "a") as f:
        f.write('{"kind": "result", "id": "mid-1", "bra')               # died mid-write
    again = CountingRunner()
    report = _scheduler(again, path, max_experiments=1).run()
    assert report.replayed == 3 and len(again.calls) == 1
    records = [json.loads(line) for line in path.read_text().splitlines()]   # all whole
    assert [r.get("kind") for r in records].count("paper") == 1                  # strong's
    assert len([r for r in records if r.get("kind") in ("result", "failure")]) == 3 + 1


def test_bad_checkpoints_raise_before_anything_runs(tmp_path):
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"some": "thing"}\n')
    runner = CountingRunner()
    with pytest.raises(CheckpointError, match="not an experiments journal"):
        _scheduler(runner, foreign).run()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"format": "dask-research.experiments.journal", "version": 1}\n'
                      'garbage\n{"kind": "paper", "branch": "a", "output": 1}\n')
    with pytest.raises(CheckpointError, match=r"line 2 is not a JSON object: 'garbage'"):
        _scheduler(runner, broken).run()
    future = tmp_path / "future.jsonl"
    future.write_text('{"format": "dask-research.experiments.journal", "version": 9}\n')
    with pytest.raises(CheckpointError, match="journal version 9 is not supported"):
        _scheduler(runner, future).run()
    assert runner.calls == []


def test_journal_round_trip(tmp_path):
    from dask_research.experiments import Result

    path = tmp_path / "j.jsonl"
    h = Hypothesis("h1", "a")
    with Journal(path) as j:
        j.record(Result(h, 0.25, {"loss": 3.0, "shape": (2, 3)}, 0.5))
        j.record(Result.failure(Hypothesis("h2", "a"), ValueError("nope")))
        j.record_paper("a", {"path": "a.md"})
    state = Journal(path).load()
    assert state.outcome(h) == Result(h, 0.25, {"loss": 3.0, "shape": [2, 3]}, 0.5)
    assert state.outcome(Hypothesis("h2", "a")).error == "ValueError: nope"
    assert state.outcome(Hypothesis("h1", "other-branch")) is None
    assert state.papers == {"a": {"path": "a.md"}}
