"""Scenarios shared by the local and the Dask tests: same input, so the same decisions."""
from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    deterministic_expander,
    make_deterministic_runner,
)

# Hand-computed UCB1 run (c = 0.5, one slot, no pruning, no paper): see
# test_slots1_sequence_equals_hand_computed_ucb1 for the arithmetic.
HAND_REWARDS = {"a1": 0.3, "a2": 0.9, "a3": 0.8, "a4": 0.7,
                "b1": 0.6, "b2": 0.5, "b3": 0.4, "b4": 0.6,
                "c1": 0.1, "c2": 0.2, "c3": 0.9, "c4": 0.9}
HAND_SEQUENCE = ["a1", "b1", "c1", "b2", "b3", "a2", "a3", "a4", "b4", "c2", "c3", "c4"]


def hand_scheduler(client=None, delay_ms=1, **kw):
    sched = IterationScheduler(make_deterministic_runner(HAND_REWARDS, delay_ms=delay_ms),
                               slots=1, c=0.5, prune_floor=0.0, paper_threshold=1.0,
                               client=client, progress=False, **kw)
    sched.add([Hypothesis(f"{b}{k}", b) for b in "abc" for k in range(1, 5)])
    return sched


def gates_scheduler(client=None, slots=1, delay_ms=2, **kw):
    """Pruning ('weak'), a paper ('strong'), follow-ups (expander), a failing branch."""
    runner = make_deterministic_runner({"strong": 0.9, "mid": 0.5, "weak": 0.1},
                                       delay_ms=delay_ms, fail={"broken"})
    sched = IterationScheduler(runner, slots=slots, c=2 ** 0.5, prune_after_runs=3,
                               prune_floor=0.2, paper_threshold=0.7, failure_limit=2,
                               expander=deterministic_expander, client=client, progress=False, **kw)
    sched.add([Hypothesis(f"{b}-{k}", b) for k in range(5)
               for b in ("strong", "mid", "weak", "broken")])
    return sched


def summary(report):
    """What must agree between backends: decisions and statistics, not timings."""
    return {
        "picks": [(e.branch, e.hypothesis) for e in report.events.of("select")],
        "stop_reason": report.stop_reason,
        "branches": {b: (s.runs, s.reward_sum, s.pruned, s.paper_emitted, s.failures)
                     for b, s in report.branches.items()},
        "paper_triggers": report.paper_triggers,
        "dropped": sorted(report.dropped),
        "expand": [(e.hypothesis, tuple(e.data["ids"])) for e in report.events.of("expand")],
    }


def queued_hand_offs(report):
    """How the experiments queued ahead handed off on their workers, from a report whose results
    carry ``pid``, ``start`` and ``end`` (``time.time()`` on the worker); ``(checked, early)``.

    Asserts what must hold whatever the machine's load: a worker runs one experiment at a time,
    and every experiment queued ahead was in the cluster (dispatched) before the driver heard
    the result of the one before it on its worker. ``early`` counts those that also *started*
    before the driver heard it: most do, but on a loaded machine the result can reach the
    driver a millisecond or two before the worker starts the next one (the stress gate saw 1.5
    and 1.75 ms), so that is a count for the caller to bound, not an assertion per hand-off.
    """
    t0 = report.events.started_at
    heard = {e.hypothesis: t0 + e.t for e in report.events.of("result")}
    dispatched = {e.hypothesis: t0 + e.t for e in report.events.of("dispatch")}
    ahead = {e.hypothesis for e in report.events.of("dispatch") if e.data.get("ahead")}
    by_worker = {}
    for r in report.results:
        by_worker.setdefault(r.metrics["pid"], []).append(r)
    checked = early = 0
    for runs in by_worker.values():
        runs.sort(key=lambda r: r.metrics["start"])
        for before, after in zip(runs, runs[1:]):
            assert before.metrics["end"] <= after.metrics["start"]       # one at a time
            if after.hypothesis.id in ahead:
                assert dispatched[after.hypothesis.id] < heard[before.hypothesis.id]   # waiting there
                early += after.metrics["start"] < heard[before.hypothesis.id]
                checked += 1
    return checked, early
