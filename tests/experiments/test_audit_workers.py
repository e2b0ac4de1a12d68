"""Audit of a cluster that loses every worker mid-run: Dask keeps the experiments until a
worker joins and the run waits with them, but it says so (it used to wait without a word,
forever where no worker came back)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
from distributed import Future, Worker
from distributed.utils_test import gen_cluster

from dask_research.experiments import Hypothesis, IterationScheduler, driver


def _short(h):
    time.sleep(0.05)
    return 0.5


async def _until(predicate, what: str, limit: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.05)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], timeout=180)
async def test_a_run_whose_cluster_loses_every_worker_warns_and_goes_on_when_one_joins(c, s, a):
    old = getattr(driver, "NO_WORKERS_WARN", None)
    driver.NO_WORKERS_WARN = 0.5
    try:
        sched = IterationScheduler(_short, slots=1, client=c, progress=False, queue_ahead=0)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(6)])
        task = asyncio.ensure_future(sched.run_async())

        def counted() -> int:
            trace = sched._recorder.trace
            return 0 if trace is None else sum(e.kind == "result" for e in trace)

        await _until(lambda: counted() >= 1, "a first result")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            await a.close()
            await _until(lambda: any("the cluster has had no workers" in str(w.message)
                                     for w in seen), "the no-workers warning")
        msg = next(str(w.message) for w in seen if "no workers" in str(w.message))
        assert "1 experiment(s) in flight wait for a worker to join" in msg and "no timeout or max_seconds" in msg
        assert not task.done()
        async with Worker(s.address, nthreads=1):
            report = await asyncio.wait_for(task, 90)
        assert report.total_runs == 6 and report.stop_reason == "queue_empty"
        assert len({r.hypothesis.id for r in report.results}) == 6
    finally:
        driver.NO_WORKERS_WARN = old


_GATE = threading.Event()
_STARTED: list[str] = []


def _gated(h):
    _STARTED.append(h.id)
    if h.id == "h0":
        _GATE.wait(60)
    return 0.5


@gen_cluster(client=True, nthreads=[("127.0.0.1", 2)], timeout=180)
async def test_an_experiment_cancelled_on_the_cluster_is_not_a_failure(c, s, a):
    """A future cancelled by someone else (client.cancel, client.restart) used to be booked as
    a failed experiment, counted against its branch's failure_limit. Now it is cancelled like
    one at the run's deadline: not counted, and dispatched again first by the next run."""
    _GATE.clear()
    _STARTED.clear()
    sched = IterationScheduler(_gated, slots=1, client=c, progress=False, queue_ahead=0, transport="tasks")
    sched.add([Hypothesis(f"h{k}", "a") for k in range(3)])
    task = asyncio.ensure_future(sched.run_async())
    try:
        await _until(lambda: "h0" in _STARTED, "h0 to start")
        keys = [k for k in list(c.futures) if str(k).startswith("experiment-") and str(k).endswith("-h0")]
        assert len(keys) == 1, list(c.futures)
        await c.cancel([Future(keys[0], c)])
        report = await asyncio.wait_for(task, 90)
    finally:
        _GATE.set()
    assert report.failures == 0 and report.cancelled == ["h0"]
    assert sorted(r.hypothesis.id for r in report.results) == ["h1", "h2"]
    assert any(e.kind == "cancel" and "not by this run" in e.data["reason"] for e in report.events)
    again = await sched.run_async()            # the cancelled one runs first, once
    assert [r.hypothesis.id for r in again.results] == ["h0"] and again.failures == 0


LOST_SCHEDULER = textwrap.dedent('''
    import sys, threading, time
    from distributed import Client, LocalCluster
    from dask_research.experiments import Hypothesis, IterationScheduler
    from dask_research.exceptions import ExperimentError

    def runner(h):
        time.sleep(0.2)
        return 0.5

    if __name__ == "__main__":
        path = sys.argv[1]
        cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0")
        client = Client(cluster)
        sched = IterationScheduler(runner, slots=2, client=client, progress=False, checkpoint=path)
        sched.add([Hypothesis(f"{b}{k}", b) for k in range(20) for b in "ab"])

        def lose_the_scheduler():
            while not (sched._recorder.trace and any(e.kind == "result" for e in sched._recorder.trace)):
                time.sleep(0.05)
            cluster.sync(cluster.scheduler.close)

        threading.Thread(target=lose_the_scheduler, daemon=True).start()
        try:
            report = sched.run()
            print("returned", report.stop_reason, report.failures, flush=True)
        except ExperimentError as exc:
            print("raised", str(exc).split(";")[0], flush=True)
        sched.close()
        resumed = IterationScheduler.resume(path, runner)
        print("resumed", sum(s.failures for s in resumed.stats.values()),
              sorted({str(s.pruned) for s in resumed.stats.values()}), flush=True)
''')


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_a_run_whose_client_loses_its_scheduler_stops_without_failing_the_experiments(tmp_path):
    """The scheduler goes away mid-run: every experiment in flight used to be booked as a
    failure (FutureCancelledError), every branch pruned for "failures" and the run returned
    "queue_empty" 30 s later, the prunes kept in the journal for good."""
    script = tmp_path / "lost_scheduler.py"
    script.write_text(LOST_SCHEDULER)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "loop.jsonl")],
                          capture_output=True, text=True, timeout=200, env=dict(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("returned", "raised", "resumed"))]
    assert lines[:1] == ["raised the Dask client lost its scheduler (client status 'connecting', "
                         "scheduler-connection-lost)"], proc.stdout + proc.stderr[-3000:]
    assert lines[1:] == ["resumed 0 ['None']"], proc.stdout + proc.stderr[-3000:]
