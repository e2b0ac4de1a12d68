"""IterationScheduler without a client: asyncio tasks, measured through its own trace."""
import asyncio
import json
import math
import threading

import dask
import pytest
from exp_scenarios import HAND_SEQUENCE, gates_scheduler, hand_scheduler, summary
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.exceptions import ExperimentError, InputError
from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    Result,
    deterministic_expander,
    make_deterministic_runner,
)
from dask_research.experiments.scheduler_run import Run


def _hyps(branches, per_branch, prefix=""):
    return [Hypothesis(f"{prefix}{b}{k}", b) for k in range(per_branch) for b in branches]


def test_slots1_sequence_equals_hand_computed_ucb1():
    # c = 0.5, N = completed runs, score = mean + 0.5 sqrt(ln N / n):
    #  1 a1 (all untried, first by insertion)  2 b1 (b, c untried)  3 c1 (c untried)
    #  4 N=3: a .3+.5*sqrt(ln3/1)=.824  b .6+.524=1.124  c .1+.524=.624  -> b2 (r .5)
    #  5 N=4: a .3+.589=.889  b .55+.5*sqrt(ln4/2)=.966  c .689           -> b3 (r .4)
    #  6 N=5: a .3+.634=.934  b .5+.366=.866  c .734                      -> a2 (r .9)
    #  7 N=6: a .6+.473=1.073 b .5+.386=.886  c .769                      -> a3 (r .8)
    #  8 N=7: a .667+.403=1.069  b .903  c .798                           -> a4 (r .7)
    #  9 a exhausted; N=8: b .5+.408=.916  c .1+.721=.821                 -> b4
    # 10-12 only c is left                                                -> c2 c3 c4
    report = hand_scheduler().run()
    assert [e.hypothesis for e in report.events.of("select")] == HAND_SEQUENCE
    step4 = report.events.of("select")[3]
    scores = report.events.scores(step4)
    assert scores["a"] == pytest.approx(0.3 + 0.5 * math.sqrt(math.log(3)))
    assert scores["b"] == pytest.approx(0.6 + 0.5 * math.sqrt(math.log(3)))
    assert scores["c"] == pytest.approx(0.1 + 0.5 * math.sqrt(math.log(3)))
    assert report.stop_reason == "queue_empty" and report.total_runs == 12


def test_untried_branches_get_priority_and_parallel_slots_spread():
    runner = make_deterministic_runner({"a": 0.9, "b": 0.5, "c": 0.4, "d": 0.3}, delay_ms=5)
    sched = IterationScheduler(runner, slots=3, progress=False, prune_floor=0.0)
    sched.add(_hyps("abcd", 3))
    report = sched.run()
    selects = report.events.of("select")
    assert [e.branch for e in selects[:3]] == ["a", "b", "c"]    # one slot each, not a,a,a
    assert all(math.isinf(s) for s in report.events.scores(selects[0]).values())
    # d is untried until its first pick and therefore the very next choice after the first 3
    assert selects[3].branch == "d" and selects[3].data["score"] == math.inf
    first_d = next(k for k, e in enumerate(selects) if e.branch == "d")
    assert first_d == 3


def test_three_experiments_really_overlap():
    # Each experiment returns only once three are in flight together (a rendezvous, waited for
    # up to 60 s): run one at a time they would all time out. Asserted on events and the
    # trace, never on the clock, so a loaded machine cannot fail it.
    in_flight, peak = [0], [0]

    async def runner(h):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        try:
            for _ in range(60_000):
                if peak[0] >= 3:
                    return 0.5
                await asyncio.sleep(0.001)
            raise RuntimeError("three experiments were never in flight together")
        finally:
            in_flight[0] -= 1

    sched = IterationScheduler(runner, slots=3, progress=False)
    sched.add(_hyps("abc", 3))
    report = sched.run()
    ivs = report.events.intervals()
    assert report.failed == [] and len(ivs) == 9 and report.events.max_concurrency() == 3
    first = sorted(ivs, key=lambda iv: iv.start)[:3]
    # All three in flight together: each of the first three started before any of them ended.
    assert max(iv.start for iv in first) < min(iv.end for iv in first)
    assert {iv.slot for iv in first} == {0, 1, 2}
    # No slot idles while work is queued: after each result the next thing is a dispatch.
    events = list(report.events)
    for k, ev in enumerate(events):
        if ev.kind == "result" and ev.data["queued"] > 0:
            nxt = next(e for e in events[k + 1:] if e.kind in ("dispatch", "result", "failure"))
            assert nxt.kind == "dispatch"


def test_a_freed_slot_is_refilled_at_once():
    runner = make_deterministic_runner(lambda h: 0.5 if h.branch != "slow" else 0.6,
                                       delay_ms=5)

    async def mixed(h):           # one long experiment must not hold back the other slots
        if h.branch == "slow":
            await asyncio.sleep(0.15)
        return await runner(h)

    sched = IterationScheduler(mixed, slots=3, progress=False)
    sched.add([Hypothesis("slow0", "slow")] + _hyps("ab", 8))
    report = sched.run()
    slow = next(iv for iv in report.events.intervals() if iv.hypothesis == "slow0")
    during = [iv for iv in report.events.intervals()
              if iv.hypothesis != "slow0" and slow.start <= iv.start <= slow.end]
    assert len(during) == 16                           # everything else ran meanwhile
    by_slot = {}
    for iv in report.events.intervals():
        by_slot.setdefault(iv.slot, []).append(iv)
    for ivs in by_slot.values():                      # a slot holds one experiment at a time
        for prev, nxt in zip(ivs, ivs[1:]):
            assert nxt.start >= prev.end
    # and is refilled right after it frees: while work is queued, the next experiment event
    # after a result is the dispatch on that result's slot (no other result is booked first)
    events = list(report.events)
    refills = 0
    for k, ev in enumerate(events):
        if ev.kind == "result" and ev.data["queued"] > 0:
            nxt = next(e for e in events[k + 1:] if e.kind in ("dispatch", "result", "failure"))
            assert (nxt.kind, nxt.slot) == ("dispatch", ev.slot)
            refills += 1
    assert refills == 17 - 3                           # every dispatch after the first three


def test_paper_trigger_once_per_branch_and_writer_runs_in_parallel():
    calls = []

    async def writer(branch, stats, best):
        calls.append((branch, stats.runs, best.hypothesis.id))
        await asyncio.sleep(0.1)
        return f"paper about {branch}"

    rewards = {"hot": 0.9, "c1": 0.5, "c2": 0.95, "c3": 0.95, "c4": 0.95, "c5": 0.95}
    sched = IterationScheduler(make_deterministic_runner(rewards, delay_ms=5, default=0.5),
                               slots=1, progress=False, paper_writer=writer)
    sched.add(_hyps(["hot"], 4) + [Hypothesis(f"c{k}", "cold") for k in range(1, 6)])
    report = sched.run()
    triggers = report.events.of("paper.trigger")
    assert [e.branch for e in triggers] == ["hot", "cold"] == report.paper_triggers
    # cold crosses 0.7 only when its mean does: 0.5, 0.725 -> after c2
    assert triggers[1].hypothesis == "c2" and triggers[1].data["mean"] == pytest.approx(0.725)
    assert [c[0] for c in calls] == ["hot", "cold"]
    assert report.papers == {"hot": "paper about hot", "cold": "paper about cold"}
    # the loop kept dispatching while the first paper was being written
    t_trigger = triggers[0].t
    t_done = next(e.t for e in report.events.of("paper.done") if e.branch == "hot")
    assert any(t_trigger < e.t < t_done for e in report.events.of("dispatch"))
    assert report.branches["hot"].paper_emitted and report.branches["cold"].paper_emitted


def test_pruning_after_low_yield_runs():
    runner = make_deterministic_runner({"good": 0.6, "weak": 0.1}, delay_ms=2)
    sched = IterationScheduler(runner, slots=1, progress=False, prune_after_runs=3,
                               prune_floor=0.2)
    sched.add(_hyps(["good", "weak"], 6))
    report = sched.run()
    weak = report.branches["weak"]
    assert weak.runs == 3 and weak.pruned == "low-mean" and weak.queued == 0
    (prune,) = report.events.of("prune")
    assert prune.branch == "weak" and prune.data["dropped"] == ["weak3", "weak4", "weak5"]
    assert sorted(report.dropped) == ["weak3", "weak4", "weak5"]
    assert all(e.branch != "weak" for e in report.events.of("select") if e.seq > prune.seq)
    assert report.branches["good"].runs == 6
    # hypotheses added to a pruned branch are dropped, not queued
    sched.add([Hypothesis("weak-late", "weak")])
    assert sched.stats["weak"].queued == 0


def test_expander_fans_out_follow_ups():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.9, "b": 0.5}, delay_ms=2),
                               slots=2, progress=False, expander=deterministic_expander)
    sched.add(_hyps("ab", 2))
    report = sched.run()
    expands = report.events.of("expand")
    assert sorted(e.hypothesis for e in expands) == ["a0", "a1"]       # only above 0.7
    assert sorted(i for e in expands for i in e.data["ids"]) == ["a0.1", "a0.2", "a1.1", "a1.2"]
    follow = {r.hypothesis.id: r.hypothesis for r in report.results}
    assert follow["a0.1"].parent == "a0" and follow["a0.1"].generation == 1
    assert report.branches["a"].runs == 6 and report.branches["b"].runs == 2
    assert report.total_runs == 8 and report.stop_reason == "queue_empty"


def test_expander_errors_and_duplicates_do_not_stop_the_loop():
    def bad(result):
        if result.hypothesis.id == "a0":
            raise ValueError("boom")
        return [Hypothesis("a0", "a")]                 # a duplicate id

    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=1), slots=1,
                               progress=False, expander=bad)
    sched.add(_hyps("a", 2))
    report = sched.run()
    errs = [e.data["error"] for e in report.events.of("expand")]
    assert errs[0] == "ValueError: boom" and "duplicate hypothesis id 'a0'" in errs[1]
    assert report.total_runs == 2


def test_budget_max_experiments_stops_dispatch_and_drains():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5, "b": 0.5}, delay_ms=10),
                               slots=3, progress=False, max_experiments=5)
    sched.add(_hyps("ab", 10))
    report = sched.run()
    assert report.stop_reason == "max_experiments"
    assert report.dispatched == 5 and report.total_runs == 5          # in-flight work drained
    (stop,) = report.events.of("stop")
    assert stop.data["in_flight"] > 0                                 # drain came after stop
    assert len(report.events.of("result")) == 5
    assert sum(s.queued for s in report.branches.values()) == 15


def test_budget_max_seconds_stops_dispatch_by_wall_clock():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=20), slots=2,
                               progress=False, max_seconds=0.2)
    sched.add(_hyps("a", 200))
    report = sched.run()
    assert report.stop_reason == "max_seconds"
    assert 4 <= report.dispatched < 200
    (stop,) = report.events.of("stop")
    assert 0.2 <= stop.t
    events = list(report.events)
    dispatches = [e for e in events if e.kind == "dispatch"]
    assert all(e.seq < stop.seq for e in dispatches)     # none after the budget ran out
    # the budget is noticed at the first decision after it: at most one result is booked
    # between the last dispatch and the stop
    between = events[dispatches[-1].seq + 1:stop.seq]
    assert len([e for e in between if e.kind == "result"]) <= 1
    assert report.total_runs == report.dispatched                     # drained
    # and only the experiments in flight at the stop ran after it
    after = events[stop.seq + 1:]
    assert [e.kind for e in after] == ["result"] * stop.data["in_flight"]


def test_zero_budget_and_empty_queue():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=0),
                               progress=False, max_experiments=0)
    sched.add(_hyps("a", 2))
    assert sched.run().stop_reason == "max_experiments"
    empty = IterationScheduler(make_deterministic_runner({}, delay_ms=0), progress=False)
    report = empty.run()
    assert report.stop_reason == "queue_empty" and report.total_runs == 0


def test_runner_failures_are_recorded_and_counted():
    report = gates_scheduler().run()
    broken = report.branches["broken"]
    assert broken.failures == 2 and broken.pruned == "failures" and broken.runs == 0
    fails = report.events.of("failure")
    assert len(fails) == 2 and all("RuntimeError: deterministic failure" in e.data["error"]
                                   for e in fails)
    assert {r.hypothesis.id for r in report.failed} == {"broken-0", "broken-1"}
    assert report.branches["weak"].pruned == "low-mean"
    assert report.paper_triggers == ["strong"]
    assert report.stop_reason == "queue_empty"


def test_runner_return_values_are_checked():
    def runner(h):
        return {"float": 0.4, "pair": (0.6, {"loss": 1.0}), "text": "good",
                "nan": math.nan, "big": 1.5, "other": Result(Hypothesis("zz", "q"), 0.1),
                "result": Result(h, 0.3, {"k": 1})}[h.id]

    sched = IterationScheduler(runner, slots=2, progress=False, failure_limit=0)
    ids = ["float", "pair", "text", "nan", "big", "other", "result"]
    sched.add([Hypothesis(i, "x") for i in ids])
    report = sched.run()
    ok = {r.hypothesis.id: r for r in report.results}
    assert ok["float"].reward == 0.4 and ok["pair"].metrics == {"loss": 1.0}
    assert ok["result"].metrics == {"k": 1} and ok["result"].duration is not None
    errors = {r.hypothesis.id: r.error for r in report.failed}
    assert "expected a Result, a number" in errors["text"]
    assert "expected a finite number" in errors["nan"]
    assert "bounded rewards must lie in [0, 1]" in errors["big"]
    assert "Result for hypothesis 'zz' on branch 'q'" in errors["other"]
    unbounded = IterationScheduler(lambda h: 5.0, bounded=False, prune_floor=-10,
                                   paper_threshold=100, progress=False)
    unbounded.add([Hypothesis("u", "x")])
    assert unbounded.run().results[0].reward == 5.0


def test_sync_runners_run_in_threads_concurrently():
    threads = set()
    # Each experiment waits until three run at once: run one after another, the first would wait
    # 60 s and fail. Concurrency is shown by the events, whatever the machine's speed.
    together = threading.Barrier(3, timeout=60)

    def runner(h):
        threads.add(threading.get_ident())
        together.wait()
        return 0.5

    sched = IterationScheduler(runner, slots=3, progress=False)
    sched.add(_hyps("abc", 2))
    report = sched.run()
    assert report.failed == [] and report.total_runs == 6
    assert report.events.max_concurrency() == 3
    ivs = sorted(report.events.intervals(), key=lambda iv: iv.start)
    for wave in (ivs[:3], ivs[3:]):                      # each three were in flight together
        assert max(iv.start for iv in wave) < min(iv.end for iv in wave)
    assert threading.get_ident() not in threads and len(threads) >= 3


def test_run_works_inside_a_running_event_loop():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=1),
                               progress=False)
    sched.add(_hyps("a", 3))

    async def notebook_cell():
        return sched.run()          # what a Jupyter user types

    assert asyncio.run(notebook_cell()).total_runs == 3


def test_run_async_and_a_second_run_continue_the_statistics():
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=1),
                               progress=False)
    sched.add(_hyps("a", 2))
    first = asyncio.run(sched.run_async())
    sched.add(_hyps("a", 2, prefix="more-"))
    second = sched.run()
    assert first.total_runs == 2 and second.total_runs == 2
    assert second.branches["a"].runs == 4


@pytest.mark.parametrize("kwargs, match", [
    ({"slots": 0}, r"slots=0 is invalid; expected an integer (>= 1|in \[1, \d+\])"),
    ({"slots": 2.5}, r"slots=2.5 is invalid"),
    ({"c": -0.1}, r"c=-0.1 is invalid; expected a finite number >= 0"),
    ({"prune_floor": 1.5}, r"prune_floor=1.5 is invalid; expected a number in \[0, 1\]"),
    ({"paper_threshold": -0.2}, r"paper_threshold=-0.2 is invalid; expected a number in"),
    ({"prune_after_runs": 0}, r"prune_after_runs=0 is invalid"),
    ({"max_experiments": -1}, r"max_experiments=-1 is invalid"),
    ({"max_seconds": 0}, r"max_seconds=0 is invalid; expected a number > 0"),
    ({"failure_limit": -1}, r"failure_limit=-1 is invalid"),
    ({"checkpoint": 3}, r"checkpoint=3 is invalid; expected a file path"),
])
def test_bad_parameters_name_the_value_and_what_is_valid(kwargs, match):
    with pytest.raises(InputError, match=match):
        IterationScheduler(lambda h: 0.5, **kwargs)


def test_thresholds_outside_01_are_fine_when_rewards_are_unbounded():
    sched = IterationScheduler(lambda h: 0.5, bounded=False, prune_floor=-3.0,
                               paper_threshold=12.0)
    assert (sched.prune_floor, sched.paper_threshold) == (-3.0, 12.0)


def test_bad_inputs_to_add_and_runner():
    sched = IterationScheduler(lambda h: 0.5, progress=False)
    sched.add([Hypothesis("h1", "a")])
    with pytest.raises(ExperimentError, match="duplicate hypothesis id 'h1'"):
        sched.add([Hypothesis("h1", "b")])
    with pytest.raises(ExperimentError, match="runner must be callable"):
        IterationScheduler("not a function")
    with pytest.raises(ExperimentError, match="expander must be callable"):
        IterationScheduler(lambda h: 0.5, expander=3)

    async def async_expander(result):
        return []

    with pytest.raises(ExperimentError, match="expander must be a plain function"):
        IterationScheduler(lambda h: 0.5, expander=async_expander)


def test_keywords_are_read_from_dask_config_at_call_time():
    with dask.config.set({"research.experiments.slots": 5, "research.experiments.c": 0.25}):
        sched = IterationScheduler(lambda h: 0.5)
        assert (sched.slots, sched.c) == (5, 0.25)
        assert IterationScheduler(lambda h: 0.5, slots=2).slots == 2
    assert IterationScheduler(lambda h: 0.5).slots == 3


def test_report_serialises_and_reads_well():
    report = gates_scheduler(slots=2).run()
    data = json.loads(report.to_json())
    assert data["stop_reason"] == "queue_empty"
    assert data["branches"]["strong"]["paper_emitted"] is True
    assert len(data["events"]) == len(report.events)
    sel = next(e for e in data["events"] if e["kind"] == "select")
    assert set(sel["scores"]) == {"strong", "mid", "weak", "broken"}
    assert sel["scores"]["mid"] == "inf"
    slim = json.loads(report.to_json(scores=False))
    assert len(slim["events"]) == len(report.events)
    assert not any("scores" in e for e in slim["events"])
    assert "events" not in json.loads(report.to_json(events=False))
    text = str(report)
    assert text.startswith("IterationScheduler report: queue_empty after")
    assert "pruned (low-mean)" in text and "paper triggers: strong" in text
    assert "<table>" in report._repr_html_()
    assert 0.0 < report.occupancy <= 1.0


def test_local_runs_are_reproducible():
    assert summary(gates_scheduler().run()) == summary(gates_scheduler().run())


def _model_ucb1_picks(queues, rewards, c):
    """Plain-Python UCB1 with one slot: the order in which hypothesis ids run."""
    order = list(queues)
    runs = {b: [] for b in order}
    picks = []
    while any(queues[b] for b in order):
        total = sum(len(v) for v in runs.values())
        best, pick = -math.inf, None
        for b in order:
            if not queues[b]:
                continue
            n = len(runs[b])
            score = math.inf if n == 0 else (
                sum(runs[b]) / n + c * math.sqrt((math.log(total) if total > 1 else 0) / n))
            if score > best:
                best, pick = score, b
        h = queues[pick].pop(0)
        picks.append(h)
        runs[pick].append(rewards[h])
    return picks


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1,
                         max_size=5), min_size=1, max_size=5),
       st.sampled_from([0.0, 0.3, 2 ** 0.5]))
def test_one_slot_follows_ucb1_for_any_rewards(branch_rewards, c):
    queues = {f"b{j}": [f"b{j}-{k}" for k in range(len(rs))]
              for j, rs in enumerate(branch_rewards)}
    rewards = {f"b{j}-{k}": r for j, rs in enumerate(branch_rewards) for k, r in enumerate(rs)}
    sched = IterationScheduler(make_deterministic_runner(rewards, delay_ms=0), slots=1, c=c,
                               prune_floor=0.0, paper_threshold=1.0, progress=False)
    # interleave the adds so that insertion order is b0, b1, ...
    sched.add([Hypothesis(h, b) for k in range(5) for b, hs in queues.items()
               for h in hs[k:k + 1]])
    report = sched.run()
    want = _model_ucb1_picks({b: list(hs) for b, hs in queues.items()}, rewards, c)
    assert [e.hypothesis for e in report.events.of("select")] == want


def test_custom_policy_progress_bar_and_best():
    from dask_research.experiments.policies import round_robin_scores

    sched = IterationScheduler(make_deterministic_runner({"a": 0.9, "b": 0.4}, delay_ms=0),
                               slots=1, progress=True, prune_floor=0.0,
                               policy=lambda mean, n, c, total: round_robin_scores(n))
    sched.add(_hyps("ab", 3))
    report = sched.run()
    assert report.events.picks() == ["a", "b"] * 3           # round-robin, not UCB
    assert report.best == "a"


def test_failing_paper_writer_and_sync_runner_errors_are_recorded():
    def writer(branch, stats, best):
        raise OSError("disk full")

    def runner(h):
        if h.id == "a1":
            raise ZeroDivisionError("division by zero")
        return 0.9

    sched = IterationScheduler(runner, slots=2, progress=False, paper_writer=writer)
    sched.add(_hyps("a", 3))
    report = sched.run()
    assert report.papers == {"a": "<OSError: disk full>"}
    (failed,) = report.events.of("paper.failed")
    assert failed.data["error"] == "OSError: disk full"
    assert [r.error for r in report.failed] == ["ZeroDivisionError: division by zero"]
    assert report.total_runs == 2


def test_shipped_helpers_refuse_bad_arguments():
    from dask_research.experiments import make_followup_expander

    with pytest.raises(ExperimentError, match=r"delay_ms=-1 is invalid; expected a number >= 0"):
        make_deterministic_runner({}, delay_ms=-1)
    with pytest.raises(ExperimentError, match=r"fanout=-1, max_generation=1 are invalid"):
        make_followup_expander(fanout=-1)


def test_each_freed_slot_is_refilled_before_the_next_result_is_booked():
    # three experiments that end on the same timer tick: each result is followed by the
    # decision and dispatch for its own slot before the next result is booked, so a slot
    # never waits for the bookkeeping of the others
    runner = make_deterministic_runner({"a": 0.5, "b": 0.5, "c": 0.5}, delay_ms=5)
    sched = IterationScheduler(runner, slots=3, progress=False, prune_floor=0.0)
    sched.add(_hyps("abc", 6))
    report = sched.run()
    kinds = [(e.kind, e.slot) for e in report.events
             if e.kind in ("result", "select", "dispatch")]
    checked = 0
    for k, (kind, slot) in enumerate(kinds):
        if kind == "result" and k + 2 < len(kinds) and kinds[k + 2][0] == "dispatch":
            assert kinds[k + 1][0] == "select" and kinds[k + 2] == ("dispatch", slot)
            checked += 1
    assert checked == 18 - 3            # every result while work was queued


def _fail_second_booking(monkeypatch, on_fail=lambda: None) -> list:
    """Make the run's second booking fail (a failing journal write, simulated); the ids booked."""
    booked = []
    real = Run.apply

    def flaky(self, *args, **kwargs):
        booked.append(args[0].id)
        if len(booked) == 2:
            on_fail()
            raise OSError("disk full (simulated)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Run, "apply", flaky)
    return booked


def test_an_error_in_the_bookkeeping_ends_the_run_and_frees_the_scheduler(monkeypatch):
    # results are booked inside the finished experiment's task (the completion hook); an
    # error there (here: a failing journal write, simulated) must surface from run(), not be
    # swallowed as a task exception, and the scheduler must be usable afterwards
    sched = IterationScheduler(make_deterministic_runner({"a": 0.5}, delay_ms=1), slots=2,
                               progress=False)
    sched.add(_hyps("a", 6))
    real = Run.apply
    booked = _fail_second_booking(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        sched.run()
    assert len(booked) == 2              # nothing was booked after the failure
    monkeypatch.setattr(Run, "apply", real)
    report = sched.run()                 # not stuck in "already running"
    assert report.stop_reason == "queue_empty"


def test_an_experiment_that_ends_after_a_failed_booking_is_not_booked(monkeypatch):
    # The stress gate caught the test above booking a third result: an experiment that ended
    # after the failed booking, but before the driver woke, was settled by the driver's own
    # loop (its completion hook had stopped, as it should). Here a2 ends right after a1's
    # booking fails, every time.
    state = {"crashed": False}

    async def runner(h):
        if h.id == "a1":
            await asyncio.sleep(0.05)
        elif h.id != "a0":                      # a2 ends right after a1's booking fails
            while not state["crashed"]:
                await asyncio.sleep(0)
        return 0.5

    sched = IterationScheduler(runner, slots=2, progress=False)
    sched.add(_hyps("a", 6))
    booked = _fail_second_booking(monkeypatch, on_fail=lambda: state.update(crashed=True))
    with pytest.raises(OSError, match="disk full"):
        sched.run()
    assert booked == ["a0", "a1"]


def test_a_paper_writer_still_writing_when_the_run_fails_stops_with_it(monkeypatch, tmp_path):
    # Found by review: the run raised, closed its journal and gave up its lease, but its paper
    # writer went on in the caller's loop (a notebook, an async client) and, when it finished,
    # wrote its output to the closed journal, taking the lease again for good.
    path = tmp_path / "loop.jsonl"
    release = asyncio.Event()
    real = Run.apply

    async def writer(branch, stats, best):
        await release.wait()
        return "paper-of-" + branch

    async def runner(h):
        await asyncio.sleep(0)
        return 0.9

    async def main():
        sched = IterationScheduler(runner, slots=1, progress=False, paper_writer=writer, paper_threshold=0.5,
                                   prune_floor=0.0, checkpoint=path)
        sched.add(_hyps("a", 4))
        with pytest.raises(OSError, match="disk full"):
            await sched.run_async()
        assert any(e.kind == "paper.trigger" for e in sched._recorder.trace)     # it was writing
        release.set()                                   # the writer would finish now
        for _ in range(20):
            await asyncio.sleep(0)
        return sched

    _fail_second_booking(monkeypatch)
    sched = asyncio.run(main())
    assert '"output"' not in path.read_text() and not (tmp_path / "loop.jsonl.lease").exists()
    assert not any(e.kind == "paper.done" for e in sched._recorder.trace)
    monkeypatch.setattr(Run, "apply", real)
    IterationScheduler.resume(path, runner)             # nothing holds the journal in this process


def test_a_runner_that_raises_cancelled_error_is_a_failure_not_a_lost_slot():
    # Found by review: the task ended cancelled, so its completion hook never ran and the wait
    # dropped it with its token still in flight; the run then failed with "Set of Tasks/Futures
    # is empty" and the experiment was never booked.
    async def runner(h):
        if h.id == "a1":
            raise asyncio.CancelledError()      # e.g. it awaited a future someone else cancelled
        await asyncio.sleep(0.01)
        return 0.5

    sched = IterationScheduler(runner, slots=2, progress=False, prune_floor=0.0)
    sched.add(_hyps("a", 5))
    report = sched.run()
    assert report.stop_reason == "queue_empty" and report.total_runs == 4 and report.failures == 1
    assert [r.hypothesis.id for r in report.failed] == ["a1"] and "CancelledError" in report.failed[0].error


def test_async_runners_on_worker_threads_reuse_one_loop_and_leave_nothing_behind():
    # execute_sync (what a Dask worker thread runs) keeps one event loop per thread instead of
    # asyncio.run per experiment; tasks a runner leaves behind are cancelled after each call,
    # and the loop is closed when its thread ends
    from dask_research.experiments.execute import execute_sync

    seen = {"loops": [], "stragglers": []}

    async def runner(h):
        loop = asyncio.get_running_loop()
        seen["loops"].append(loop)

        async def straggler():
            await asyncio.sleep(10)

        seen["stragglers"].append(loop.create_task(straggler()))
        await asyncio.sleep(0)
        return 0.5

    def worker_thread():
        for k in range(3):
            assert execute_sync(runner, Hypothesis(f"t{k}", "a"), bounded=True).reward == 0.5
            assert seen["stragglers"][-1].cancelled()
        with pytest.raises(RuntimeError):          # no loop is left set on the thread
            asyncio.get_event_loop_policy().get_event_loop()

    t = threading.Thread(target=worker_thread)
    t.start()
    t.join()
    assert len({id(lp) for lp in seen["loops"]}) == 1
    import gc

    gc.collect()
    assert seen["loops"][0].is_closed()
