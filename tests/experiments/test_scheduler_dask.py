"""IterationScheduler on a Dask cluster (either transport): the same decisions as without a client."""
import asyncio

import pytest
from distributed.utils_test import gen_cluster
from exp_scenarios import HAND_SEQUENCE, gates_scheduler, hand_scheduler, summary

from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner


@pytest.mark.parametrize("transport", ["actors", "tasks"])
@gen_cluster(client=True, timeout=60)
async def test_async_client_matches_local_decisions(c, s, a, b, transport):
    """Without queueing ahead (which decides before the last result, by timing) a run on Dask
    decides as a local one, on either transport."""
    report = await hand_scheduler(client=c, transport=transport, queue_ahead=0).run_async()
    assert [e.hypothesis for e in report.events.of("select")] == HAND_SEQUENCE
    assert summary(report) == summary(hand_scheduler().run())
    gates = await gates_scheduler(client=c, transport=transport, queue_ahead=0).run_async()
    local = gates_scheduler().run()
    assert summary(gates) == summary(local)
    assert gates.branches["broken"].pruned == "failures"
    assert all("RuntimeError: deterministic failure" in r.error for r in gates.failed)


@gen_cluster(client=True, timeout=60)
async def test_slots_overlap_on_dask_workers(c, s, a, b):
    # gen_cluster's workers have 1 + 2 threads: three experiments fit at once
    runner = make_deterministic_runner({"a": 0.5, "b": 0.5, "c": 0.5}, delay_ms=100)
    sched = IterationScheduler(runner, slots=3, client=c, progress=False)
    sched.add([Hypothesis(f"{x}{k}", x) for k in range(2) for x in "abc"])
    report = await sched.run_async()
    assert report.events.max_concurrency() == 3
    first = sorted(report.events.intervals(), key=lambda iv: iv.start)[:3]
    assert min(iv.end for iv in first) - max(iv.start for iv in first) > 0.05
    assert report.total_runs == 6
    # Overlapped, by the experiments' own intervals (never a wall-clock bound: a busy machine
    # makes the run as long as it likes): six 100 ms experiments on three slots ran in at most
    # about two experiments' time each slot, so their intervals sum to more than the run's span.
    spans = report.events.intervals()
    assert sum(iv.end - iv.start for iv in spans) > max(iv.end for iv in spans) - min(iv.start for iv in spans)


@gen_cluster(client=True, timeout=60)
async def test_events_reach_the_dask_event_log(c, s, a, b):
    sched = hand_scheduler(client=c)
    report = await sched.run_async()
    msgs = [msg for _, msg in await c.get_events("research.experiments")]
    assert {m["event"] for m in msgs} == {"batch"} and {m["run"] for m in msgs} == {report.run_id}
    logged = [ev for m in msgs for ev in m["events"]]
    assert len(logged) == len(report.events)
    assert [e["event"] for e in logged] == [e.kind for e in report.events]
    assert {e["run"] for e in logged} == {report.run_id}
    sel = next(e for e in logged if e["event"] == "select")
    assert set(sel["scores"]) == {"a", "b", "c"}


@gen_cluster(client=True, timeout=60)
async def test_paper_writer_runs_as_a_future_and_budgets_apply(c, s, a, b):
    def writer(branch, stats, best):
        return f"{branch}:{stats.runs}"

    runner = make_deterministic_runner({"x": 0.9, "y": 0.3}, delay_ms=5)
    sched = IterationScheduler(runner, slots=2, client=c, progress=False, paper_writer=writer,
                               max_experiments=6)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(10) for b in "xy"])
    report = await sched.run_async()
    assert report.stop_reason == "max_experiments" and report.total_runs == 6
    assert report.papers == {"x": "x:1"}


def test_blocking_client_run_and_run_async(client):
    report = hand_scheduler(client=client, queue_ahead=0).run()
    assert [e.hypothesis for e in report.events.of("select")] == HAND_SEQUENCE
    gates = gates_scheduler(client=client, slots=1, queue_ahead=0).run()
    assert summary(gates) == summary(gates_scheduler().run())
    # the coroutine API with a blocking client, from a foreign event loop
    again = asyncio.run(hand_scheduler(client=client, queue_ahead=0).run_async())
    assert summary(again) == summary(report)
    logged = client.get_events("research.experiments")
    assert sum(len(m["events"]) for _, m in logged) >= len(report.events) + len(gates.events)


@gen_cluster(client=True, timeout=60)
async def test_run_with_an_asynchronous_client_points_to_run_async(c, s, a, b):
    import pytest

    from dask_research.exceptions import ExperimentError

    with pytest.raises(ExperimentError, match=r"client is asynchronous; use `report = await "
                                              r"sched.run_async\(\)`"):
        hand_scheduler(client=c).run()


@gen_cluster(client=True, timeout=60)
async def test_many_branches_log_only_the_best_scores(c, s, a, b):
    runner = make_deterministic_runner(lambda h: int(h.branch[1:]) / 40, delay_ms=0)
    sched = IterationScheduler(runner, slots=2, client=c, progress=False, prune_floor=0.0)
    sched.add([Hypothesis(f"h{k}", f"b{k}") for k in range(40)] + [Hypothesis("again", "b39")])
    report = await sched.run_async()
    logged = [ev for _, msg in await c.get_events("research.experiments") for ev in msg["events"]]
    last = [e for e in logged if e["event"] == "select"][-1]
    assert last["scores_truncated"] == 40 and len(last["scores"]) == 32
    full = report.events.scores(report.events.of("select")[-1])
    best32 = sorted(full, key=lambda b: -full[b])[:32]
    assert set(last["scores"]) == set(best32)


def _two_objectives(h):
    return {"a": (0.9, 0.2), "b": (0.5, 0.1), "c": (0.4, 0.6)}[h.branch]


@gen_cluster(client=True, timeout=60)
async def test_vector_rewards_and_dispatch_order_on_dask_workers(c, s, a, b):
    def build(client):
        sched = IterationScheduler(_two_objectives, slots=2, client=client, progress=False,
                                   policy="pareto-ucb1", objectives=["acc", ("cost", "min")],
                                   apply_order="dispatch", prune_floor=0.0)
        sched.add([Hypothesis(f"{x}{k}", x) for k in range(3) for x in "abc"])
        return sched

    report = await build(c).run_async()
    local = build(None).run()
    assert report.pareto_front == local.pareto_front == ["a", "b"]
    assert [e.hypothesis for e in report.events.of("select")] == [
        e.hypothesis for e in local.events.of("select")]
    assert report.results[0].reward in {(0.9, 0.2), (0.5, 0.1), (0.4, 0.6)}


PICKLED = []


class _CountingRunner:
    """A runner standing in for a closure over a large model: counts how often it pickles."""

    def __init__(self, reward):
        self.reward = reward

    def __reduce__(self):
        PICKLED.append(1)
        return (_CountingRunner, (self.reward,))

    def __call__(self, h):
        return self.reward


@gen_cluster(client=True, timeout=60)
async def test_the_runner_travels_once_per_run_not_per_experiment(c, s, a, b):
    counts = []
    for n in (4, 16):
        PICKLED.clear()
        sched = IterationScheduler(_CountingRunner(0.5), slots=3, client=c, progress=False,
                                   prune_floor=0.0)
        sched.add([Hypothesis(f"n{n}-{k}", f"b{k % 3}") for k in range(n)])
        report = await sched.run_async()
        assert report.total_runs == n
        counts.append(len(PICKLED))
    # pickled once per run on the client; tasks carry the bytes (not once per experiment,
    # which would be 4 and 16 at the least)
    assert counts == [1, 1], counts


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("this payload holds a lock")


@gen_cluster(client=True, timeout=60)
async def test_a_payload_that_does_not_pickle_names_the_hypothesis(c, s, a, b):
    import pytest

    from dask_research.exceptions import ExperimentError

    sched = IterationScheduler(lambda h: 0.5, slots=2, client=c, progress=False)
    sched.add([Hypothesis("fine", "a"), Hypothesis("locked", "b", payload=_Unpicklable())])
    with pytest.raises(ExperimentError, match=r"could not start hypothesis 'locked' on branch "
                                              r"'b'.*runner and every payload must pickle"):
        await sched.run_async()


_LOG: list = []


def _logged_sleep(h):
    _LOG.append(("start", h.id))
    import time
    time.sleep(0.05 if h.id == "a0" else 5.0)     # a2 would start 5 s after a0: far after the cancel
    _LOG.append(("end", h.id))
    return 0.5


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=90)
async def test_a_failed_run_leaves_nothing_queued_on_the_cluster(c, s, a):
    """A run that fails (here its first booking) cancels what it queued on the cluster: the
    experiments queued ahead never start (found by review: dropping the futures did not release
    them, as_completed held them, and they ran after run() had raised)."""
    from dask_research.experiments.scheduler_run import Run

    def boom(self, *args, **kwargs):
        raise OSError("disk full (simulated)")

    real, Run.apply = Run.apply, boom
    _LOG.clear()
    try:
        sched = IterationScheduler(_logged_sleep, slots=1, client=c, progress=False, queue_ahead=2,
                                   prune_floor=0.0)
        sched.add([Hypothesis(f"a{i}", "a") for i in range(6)])
        try:
            await sched.run_async()
        except OSError:
            pass
        else:
            raise AssertionError("the run did not fail")
    finally:
        Run.apply = real
    deadline = asyncio.get_running_loop().time() + 60
    while any(str(k).startswith("experiment") for k in s.tasks):
        assert asyncio.get_running_loop().time() < deadline, sorted(map(str, s.tasks))
        await asyncio.sleep(0.05)
    while ("start", "a1") in _LOG and ("end", "a1") not in _LOG:     # one running when it failed ends
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert not {("start", "a2"), ("start", "a3")} & set(_LOG), _LOG
