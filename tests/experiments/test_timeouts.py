"""A hanging runner never hangs the run (issue 14): the per-experiment ``timeout`` records a
failure, ``max_seconds`` plus ``cancel_grace`` cancels what is still in flight, on both
backends; a real process with a stuck sync runner exits."""
import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from distributed.utils_test import gen_cluster

from dask_research.exceptions import InputError
from dask_research.experiments import Hypothesis, IterationScheduler

RELEASE = threading.Event()        # set at the end of each test: abandoned threads end


@pytest.fixture(autouse=True)
def _release_stuck_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


def sync_runner(h):
    """Hangs on hypotheses whose payload says so, else a reward by branch."""
    if h.payload == "hang":
        RELEASE.wait(120)
        return 0.0
    time.sleep(0.01)
    return 0.8 if h.branch == "good" else 0.4


async def async_runner(h):
    if h.payload == "hang":
        await asyncio.sleep(120)
    await asyncio.sleep(0.01)
    return 0.8 if h.branch == "good" else 0.4


def _hyps(hang=("good-1",), n=3):
    return [Hypothesis(f"{b}-{k}", b, "hang" if f"{b}-{k}" in hang else None)
            for k in range(n) for b in ("good", "fair")]


@pytest.mark.slow
@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("runner", [sync_runner, async_runner], ids=["sync", "async"])
def test_an_experiment_past_its_timeout_is_a_failure(runner):
    sched = IterationScheduler(runner, slots=2, timeout=2.0, prune_floor=0.0,
                               progress=False)
    sched.add(_hyps())
    report = sched.run()
    assert report.stop_reason == "queue_empty" and report.timed_out == ["good-1"]
    assert [r.hypothesis.id for r in report.failed] == ["good-1"]
    assert report.failed[0].error.startswith(
        "ExperimentTimeout: 'good-1' ran longer than timeout=2 s and was cancelled")
    assert report.branches["good"].failures == 1 and report.branches["good"].runs == 2
    assert report.total_runs == 5 and not report.cancelled
    fail = report.events.of("failure")[0]
    assert fail.hypothesis == "good-1" and fail.data["failures"] == 1
    assert "timed out (1, counted as failed): good-1" in str(report)


@pytest.mark.slow
@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("runner", [sync_runner, async_runner], ids=["sync", "async"])
def test_max_seconds_bounds_the_run_and_cancels_in_flight_work(runner):
    sched = IterationScheduler(runner, slots=2, max_seconds=1.0, cancel_grace=0.3,
                               prune_floor=0.0, progress=False)
    sched.add(_hyps(hang=("good-0", "fair-0")))
    report = sched.run()
    assert report.stop_reason == "max_seconds"
    assert sorted(report.cancelled) == ["fair-0", "good-0"]
    assert not report.failed and report.branches["good"].failures == 0
    cancels = report.events.of("cancel")
    assert {e.hypothesis for e in cancels} == {"good-0", "fair-0"}
    assert "still running 0.3 s after max_seconds=1" in cancels[0].data["reason"]
    assert report.events.max_concurrency() == 2 and not report.events.intervals() == []
    assert "cancelled at the deadline (2, not counted)" in str(report)
    # the next run dispatches the cancelled ones again first (here they hang again: a
    # larger budget and a timeout turn them into failures)
    sched.max_seconds, sched.timeout = None, 1.5
    again = sched.run()
    first = [e.hypothesis for e in again.events.of("dispatch") if not e.data.get("restored")]
    assert sorted(first[:2]) == ["fair-0", "good-0"]
    assert sorted(again.timed_out) == ["fair-0", "good-0"] and not again.cancelled


@pytest.mark.timeout(60, method="thread")
def test_with_dispatch_order_results_after_a_cancelled_one_are_still_counted():
    sched = IterationScheduler(sync_runner, slots=2, max_seconds=1.0, cancel_grace=0.2,
                               prune_floor=0.0, apply_order="dispatch", progress=False)
    sched.add(_hyps(hang=("good-0",), n=4))
    report = sched.run()
    assert report.cancelled == ["good-0"]
    finished = [e.hypothesis for e in report.events.of("finish")]
    # every experiment that finished behind the stuck one is counted, in dispatch order
    assert finished and sorted(r.hypothesis.id for r in report.results) == sorted(finished)
    assert report.total_runs == len(finished) and not report.failed


@pytest.mark.timeout(60, method="thread")
def test_a_cancelled_experiment_resumes_from_the_checkpoint(tmp_path):
    path = tmp_path / "loop.jsonl"
    sched = IterationScheduler(sync_runner, slots=1, max_seconds=0.5, cancel_grace=0.1,
                               prune_floor=0.0, progress=False, checkpoint=path)
    sched.add(_hyps(hang=("good-0",)))
    first = sched.run()
    assert first.cancelled == ["good-0"] and first.total_runs == 0
    later = IterationScheduler.resume(path, lambda h: 0.5, max_seconds=None)
    report = later.run()
    requeued = [e.hypothesis for e in report.events.of("dispatch") if e.data.get("requeued")]
    assert requeued == ["good-0"] and report.total_runs == 6


def test_timeout_settings_are_checked():
    with pytest.raises(InputError, match=r"timeout=0 is invalid.*seconds > 0"):
        IterationScheduler(sync_runner, timeout=0)
    with pytest.raises(InputError, match=r"cancel_grace=-1 is invalid"):
        IterationScheduler(sync_runner, cancel_grace=-1)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["actors", "tasks"])
@gen_cluster(client=True, timeout=60)
async def test_dask_futures_time_out_and_are_cancelled(c, s, a, b, transport):
    """On either transport; on actors an experiment sent to an idle actor had no clock at all
    (its start was reported before the driver had booked it), so a hang there never timed out."""
    sched = IterationScheduler(sync_runner, slots=2, timeout=2.0, prune_floor=0.0,
                               client=c, progress=False, transport=transport)
    sched.add(_hyps())
    report = await sched.run_async()
    assert report.timed_out == ["good-1"] and report.branches["good"].failures == 1
    assert report.total_runs == 5
    hung = [k for k in s.tasks if "good-1" in str(k)]
    assert not hung or all(s.tasks[k].state in ("released", "forgotten") for k in hung)

    sched = IterationScheduler(sync_runner, slots=2, max_seconds=1.0, cancel_grace=0.3,
                               prune_floor=0.0, client=c, progress=False, transport=transport)
    sched.add(_hyps(hang=("good-0", "fair-0")))
    report = await sched.run_async()
    assert report.stop_reason == "max_seconds"
    assert sorted(report.cancelled) == ["fair-0", "good-0"]
    RELEASE.set()                       # the worker threads still run the stuck calls


SCRIPT = """
import time
from dask_research.experiments import Hypothesis, IterationScheduler

def runner(h):
    if h.id == "a-1":
        time.sleep(10 ** 6)             # never returns
    return 0.5

sched = IterationScheduler(runner, slots=2, max_seconds=1.0, cancel_grace=0.5,
                           progress=False)
sched.add([Hypothesis(f"a-{k}", "a") for k in range(4)])
report = sched.run()
print("REPORT", report.stop_reason, report.cancelled, flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(120, method="thread")
def test_a_process_with_a_stuck_sync_runner_returns_and_exits(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err
    assert "REPORT queue_empty ['a-1']" in out        # the queue emptied; a-1 never returned


@pytest.mark.slow
@pytest.mark.timeout(120, method="thread")
def test_worker_processes_a_hanging_runner_times_out_and_the_deadline_holds(client):
    # `client`: distributed.utils_test's cluster of real worker processes
    def runner(h):
        if h.payload == "hang":
            time.sleep(30)              # never returns within the run
        return 0.8 if h.branch == "good" else 0.4

    sched = IterationScheduler(runner, slots=2, timeout=3.0, prune_floor=0.0,
                               client=client, progress=False)
    sched.add(_hyps())
    report = sched.run()
    assert report.timed_out == ["good-1"] and report.total_runs == 5
    assert report.failed[0].error.startswith("ExperimentTimeout: 'good-1' ran longer")

    sched = IterationScheduler(runner, slots=2, max_seconds=1.0, cancel_grace=0.5,
                               prune_floor=0.0, client=client, progress=False)
    sched.add(_hyps(hang=("good-0", "fair-0")))
    report = sched.run()
    assert report.stop_reason == "max_seconds"
    assert sorted(report.cancelled) == ["fair-0", "good-0"]
