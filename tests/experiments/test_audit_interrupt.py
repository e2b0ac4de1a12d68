"""Audit of a run interrupted from outside: close() from another thread while run() is in
progress, and Ctrl-C where an event loop already runs in the driver's thread (Jupyter)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from dask_research.exceptions import CheckpointError, ExperimentError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.testing.threads import in_thread


@pytest.mark.timeout(120, method="thread")
def test_close_from_another_thread_during_a_run_is_refused_and_keeps_the_lease(tmp_path):
    """close() used to release the journal's lease under the running loop: a second driver
    could then resume the journal and run again what the first still had in flight."""
    path = tmp_path / "loop.jsonl"
    gate, started = threading.Event(), threading.Event()

    def runner(h):
        started.set()
        gate.wait(60)
        return 0.5

    sched = IterationScheduler(runner, slots=1, progress=False, checkpoint=path)
    sched.add([Hypothesis("a0", "a"), Hypothesis("b0", "b")])
    t, box = in_thread(sched.run)
    try:
        assert started.wait(60)
        with pytest.raises(ExperimentError, match=r"close\(\) while run\(\) is in progress"):
            sched.close()
        with pytest.raises(CheckpointError, match="loop.jsonl"):     # still held by the run
            IterationScheduler.resume(path, runner)
    finally:
        gate.set()
        t.join(60)
    assert box["result"].total_runs == 2
    sched.close()                                  # after the run: nothing to refuse
    assert IterationScheduler.resume(path, runner).stats["a"].runs == 1


NOTEBOOK = textwrap.dedent("""
    import asyncio, os, signal, sys, threading
    from dask_research.experiments import Hypothesis, IterationScheduler
    path = sys.argv[1]
    gate, started = threading.Event(), threading.Event()

    def runner(h):
        started.set()
        gate.wait(60)                       # still running when Ctrl-C comes
        return 0.5

    sched = IterationScheduler(runner, slots=2, progress=False, checkpoint=path)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(3) for b in "ab"])

    def ctrl_c():
        started.wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    async def cell():                       # a notebook cell: an event loop runs here
        return sched.run()

    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        asyncio.new_event_loop().run_until_complete(cell())
        print("not interrupted")
    except KeyboardInterrupt:
        for t in threading.enumerate():     # ends as the run winds down (the old one ran on)
            if t.name == "IterationScheduler":
                t.join(30)
        alive = [t.name for t in threading.enumerate() if t.name == "IterationScheduler"]
        print("interrupted", alive, sched._running, flush=True)
    gate.set()
    again = IterationScheduler.resume(path, lambda h: 0.5, progress=False)
    report = again.run()
    ids = [r.hypothesis.id for r in report.results]
    print("resumed", len(ids), len(set(ids)), flush=True)
""")


@pytest.mark.timeout(180, method="thread")
def test_ctrl_c_stops_a_run_started_under_a_running_event_loop(tmp_path):
    """Where an event loop already runs (Jupyter), run() drives its own loop in a helper
    thread. Ctrl-C used to leave that thread running the whole search in the background,
    holding the journal; now it stops the run as it does without a loop: nothing runs on,
    the lease is released, and a resume in the same process finishes the search."""
    path = tmp_path / "loop.jsonl"
    proc = subprocess.run([sys.executable, "-c", NOTEBOOK, str(path)], capture_output=True,
                          text=True, timeout=150, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "interrupted [] False", proc.stdout + proc.stderr[-2000:]
    assert lines[1] == "resumed 6 6", proc.stdout + proc.stderr[-2000:]


BLOCKING_CLIENT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from distributed import Client, LocalCluster
    from dask_research.experiments import Hypothesis, IterationScheduler

    def runner(h, flags=sys.argv[2]):
        open(os.path.join(flags, "started"), "w").close()
        for _ in range(1200):                   # until released (at most 60 s)
            if os.path.exists(os.path.join(flags, "go")):
                break
            time.sleep(0.05)
        return 0.5

    if __name__ == "__main__":
        path, flags = sys.argv[1], sys.argv[2]
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            sched = IterationScheduler(runner, slots=2, progress=False, client=client,
                                       checkpoint=path)
            sched.add([Hypothesis(f"{b}{k}", b) for k in range(3) for b in "ab"])

            def ctrl_c():
                while not os.path.exists(os.path.join(flags, "started")):
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=ctrl_c, daemon=True).start()
            try:
                sched.run()
                print("not interrupted", flush=True)
            except KeyboardInterrupt:
                print("interrupted", sched._running, flush=True)
            open(os.path.join(flags, "go"), "w").close()
            again = IterationScheduler.resume(path, runner, client=client, progress=False)
            report = again.run()
            ids = [r.hypothesis.id for r in report.results]
            print("resumed", len(ids), len(set(ids)), flush=True)
""")


@pytest.mark.timeout(240, method="thread")
def test_ctrl_c_on_a_blocking_client_returns_once_the_run_has_wound_down(tmp_path):
    """distributed's sync() raises KeyboardInterrupt at once and cancels the driver on the
    client's loop; run() used to return while that run still held its journal (a resume right
    after Ctrl-C was refused: "already held by another writer in this process")."""
    path, flags = tmp_path / "loop.jsonl", tmp_path / "flags"
    flags.mkdir()
    script = tmp_path / "blocking_client.py"
    script.write_text(BLOCKING_CLIENT)
    proc = subprocess.run([sys.executable, str(script), str(path), str(flags)], capture_output=True,
                          text=True, timeout=200, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("interrupted", "resumed", "not"))]
    assert lines == ["interrupted False", "resumed 6 6"], proc.stdout + proc.stderr[-2000:]


@pytest.mark.timeout(120, method="thread")
def test_tell_from_another_thread_during_a_run_is_refused(tmp_path):
    """A resumed scheduler with asks pending at the crash may be told at once; not while its
    run() dispatches those same experiments again."""
    path = tmp_path / "loop.jsonl"
    first = IterationScheduler(None, progress=False, checkpoint=path)
    first.add([Hypothesis("a0", "a"), Hypothesis("b0", "b")])
    first.ask()
    first.close()
    gate, started = threading.Event(), threading.Event()

    def runner(h):
        started.set()
        gate.wait(60)
        return 0.5

    sched = IterationScheduler.resume(path, runner, progress=False)
    t, box = in_thread(sched.run)
    try:
        assert started.wait(60)
        with pytest.raises(ExperimentError, match=r"run\(\) is in progress; tell\(\) is for"):
            sched.tell("a0", 0.5)
    finally:
        gate.set()
        t.join(60)
    assert sorted(r.hypothesis.id for r in box["result"].results) == ["a0", "b0"]
