"""Ask/tell (issue 17): the scheduler decides, the user's loop runs the experiments; the same
ledger, gates, journal and trace as run(); pending asks are in-flight pulls; resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dask_research.exceptions import ExperimentError, InputError
from dask_research.experiments import Hypothesis, IterationScheduler, JournalLockWarning, Result


def hyps(n: int = 4, branches: str = "abc") -> list[Hypothesis]:
    value = {"a": 0.9, "b": 0.5, "c": 0.05}
    return [Hypothesis(f"{b}{k}", b, value[b]) for k in range(n) for b in branches]


def drive(sched: IterationScheduler, n: int) -> list[str]:
    asked = []
    for _ in range(n):
        h = sched.ask()
        asked.append(h.id)
        sched.tell(h, h.payload)
    return asked


def test_ask_tell_makes_the_decisions_run_makes():
    """With one slot, run() and an ask/tell loop make the same decisions and gate the same."""
    ran = IterationScheduler(lambda h: h.payload, slots=1, progress=False)
    ran.add(hyps())
    r_run = ran.run()
    at = IterationScheduler(None, slots=1, progress=False)
    at.add(hyps())
    order = drive(at, r_run.total_runs)
    r_at = at.report()
    assert order == [r.hypothesis.id for r in r_run.results]
    assert r_at.paper_triggers == r_run.paper_triggers == ["a"]
    assert r_at.branches["c"].pruned == r_run.branches["c"].pruned == "low-mean"
    assert r_at.dropped == r_run.dropped
    kinds = [e.kind for e in r_at.events]
    assert {"select", "dispatch", "result", "prune", "paper.trigger"} <= set(kinds)
    assert all(e.slot is None for e in r_at.events if e.kind == "dispatch")
    assert r_at.stop_reason == "queue_empty"
    with pytest.raises(ExperimentError, match="nothing to ask"):
        at.ask()


def test_pending_asks_count_as_in_flight():
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps())
    first = [sched.ask() for _ in range(3)]
    assert sorted(h.branch for h in first) == ["a", "b", "c"]   # spread, like parallel slots
    assert sum(s.pending for s in sched.stats.values()) == 3
    sched.tell(first[1], 0.5)
    assert sum(s.pending for s in sched.stats.values()) == 2


def test_unknown_duplicate_and_bad_tells_are_errors_and_record_nothing():
    sched = IterationScheduler(None, progress=False)
    sched.add(hyps())
    with pytest.raises(ExperimentError, match="before any ask"):
        sched.tell("a0", 0.5)
    h = sched.ask()
    with pytest.raises(ExperimentError, match="not asked"):
        sched.tell("nope", 0.5)
    with pytest.raises(ExperimentError, match="was asked on branch"):
        sched.tell(Hypothesis(h.id, "zzz"), 0.5)
    for bad in (1.5, float("nan"), "high", None):
        with pytest.raises(InputError, match=repr(h.id)):
            sched.tell(h, bad)
    assert sched.stats[h.branch].runs == 0 and sched.stats[h.branch].pending == 1
    res = sched.tell(h.id, (0.7, {"loss": 0.3}), duration=2.0)
    assert res.reward == 0.7 and res.metrics == {"loss": 0.3} and res.duration == 2.0
    with pytest.raises(ExperimentError, match="duplicate tell"):
        sched.tell(h, 0.7)
    # a failed experiment is told as a failed Result
    h2 = sched.ask()
    sched.tell(h2, Result.failure(h2, RuntimeError("diverged")))
    assert sched.stats[h2.branch].failures == 1
    r = sched.report()
    assert r.total_runs == 1 and r.failures == 1 and r.failed[0].error == "RuntimeError: diverged"


def test_budget_and_mode_errors():
    sched = IterationScheduler(None, progress=False, max_experiments=2)
    sched.add(hyps())
    drive(sched, 2)
    with pytest.raises(ExperimentError, match="max_experiments"):
        sched.ask()
    with pytest.raises(ExperimentError, match="no runner"):
        sched.run()
    s2 = IterationScheduler(lambda h: 0.5, progress=False)
    s2.add(hyps())
    s2.ask()
    with pytest.raises(ExperimentError, match="ask/tell session"):
        s2.run()


def test_paper_writer_runs_in_the_tell_that_triggers_it():
    papers = []

    def writer(branch, stats, best):
        papers.append((branch, best.hypothesis.id))
        return f"paper on {branch}"

    sched = IterationScheduler(None, progress=False, paper_writer=writer)
    sched.add(hyps(2))
    drive(sched, 6)
    r = sched.report()
    assert papers == [("a", "a0")] and r.papers == {"a": "paper on a"}


CRASH = textwrap.dedent("""
    import os, sys
    from dask_research.experiments import Hypothesis, IterationScheduler
    path, n = sys.argv[1], int(sys.argv[2])
    sched = IterationScheduler(None, progress=False, objective="max", checkpoint=path)
    value = {"a": 0.9, "b": 0.5, "c": 0.05}
    sched.add([Hypothesis(f"{b}{k}", b, value[b] - 0.01 * k) for k in range(5) for b in "abc"])
    asked = [sched.ask() for _ in range(n + 2)]     # two asks stay pending
    for h in asked[:n]:
        sched.tell(h, h.payload)
    print(",".join(h.id for h in asked[n:]), flush=True)
    os._exit(9)                                       # killed: no report(), no close()
""")


@pytest.mark.timeout(120, method="thread")
def test_ask_tell_session_resumes_from_its_journal_after_a_crash(tmp_path):
    """A real process asks, tells, and dies with two asks pending; a new scheduler resumes the
    journal: statistics as told, the pending asks asked again first, then new decisions."""
    path = tmp_path / "search.jsonl"
    proc = subprocess.run([sys.executable, "-c", CRASH, str(path), "5"], capture_output=True,
                          text=True, timeout=100, env=dict(os.environ))
    assert proc.returncode == 9, proc.stderr
    pending = proc.stdout.strip().split(",")
    assert len(pending) == 2

    with pytest.warns(JournalLockWarning, match="on this host, is gone"):
        sched = IterationScheduler.resume(path)       # the dead driver's lock is taken over
    assert sched.objective == "max"
    stats = sched.stats
    assert sum(s.runs for s in stats.values()) == 5
    assert sum(s.pending for s in stats.values()) == 2
    # one pending ask is asked again; the other is told directly (the user had its result)
    again = sched.ask()
    assert again.id == pending[0]
    sched.tell(pending[1], 0.42)
    sched.tell(again, again.payload)
    drive(sched, 3)
    r = sched.report()
    assert r.replayed == 5 and r.total_runs == 10
    ids = [x.hypothesis.id for x in r.results]
    assert len(ids) == len(set(ids)) == 10
    assert r.best == "a" and r.best_result.reward == 0.9
    # the journal holds one outcome per hypothesis, in the order they were told
    outcomes = [json.loads(line)["e"]["hypothesis"] for line in open(path)
                if '"kind": "event"' in line and json.loads(line)["e"]["kind"] == "result"]
    assert outcomes == ids
