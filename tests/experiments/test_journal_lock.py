"""One driver per journal (issue 14): a second driver is refused at once, naming the holder;
a stale lock (dead pid, or no heartbeat for ``research.experiments.lock-timeout``) is taken
over; a driver whose lock was taken over while it was frozen stops without writing."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import crash_scenario as cs
import dask
import pytest

from dask_research.exceptions import CheckpointError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.checkpoint import Journal
from dask_research.experiments.lock import JournalLock, JournalLockWarning

HERE = pathlib.Path(__file__).resolve().parent

DRIVER = """
import asyncio, os, sys
sys.path.insert(0, {tests!r})
import crash_scenario as cs
from dask_research.exceptions import CheckpointError


class Gated(cs.LoggingRunner):
    # after 4 experiments, each waits until the test creates the gate file
    async def __call__(self, h):
        while len(self.calls) >= 4 and not os.path.exists({gate!r}):
            await asyncio.sleep(0.01)
        return await super().__call__(h)


runner = Gated({log!r}, {delay!r})
try:
    report = cs.scheduler(runner, {path!r}, slots=2, prune=False).run()
except CheckpointError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
print("DONE", report.total_runs, report.replayed, flush=True)
"""


def _driver(tmp_path, name, path, delay, env=None, gate=None):
    script = tmp_path / f"{name}.py"
    log = tmp_path / f"{name}.log"
    gate = str(gate or tmp_path / "open-gate")
    if not gate.endswith("closed-gate"):
        pathlib.Path(gate).touch()
    script.write_text(textwrap.dedent(DRIVER.format(tests=str(HERE), log=str(log),
                                                    delay=delay, path=str(path), gate=gate)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    return proc, log


def _wait_results(path, n, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count('"kind": "result"') >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"the driver ended early: {proc.communicate()}")
        time.sleep(0.01)
    pytest.fail(f"no {n} results in {timeout} s")


def _kill(*procs):
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGKILL)
        p.wait(30)


def _each_once(path):
    """Every hypothesis has at most one outcome in the journal, and it reads whole."""
    state = Journal(path).load()
    outcomes = [r["e"]["hypothesis"] for r in state.records if r["kind"] == "event"
                and r["e"]["kind"] in ("result", "failure")]
    assert len(outcomes) == len(set(outcomes))
    return outcomes


@pytest.mark.timeout(120, method="thread")
def test_a_second_driver_process_is_refused_at_once_naming_the_holder(tmp_path):
    path = tmp_path / "loop.jsonl"
    gate = tmp_path / "closed-gate"                    # the first waits after 4 experiments
    first, first_log = _driver(tmp_path, "first", path, delay=0.01, gate=gate)
    second = None
    try:
        _wait_results(path, 3, first)
        t0 = time.monotonic()
        second, second_log = _driver(tmp_path, "second", path, delay=0.0)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 3, err
        host = socket.gethostname()
        assert f"checkpoint {path}: is in use by another driver: pid {first.pid} on host " \
               f"{host}" in out and "heartbeat" in out
        assert not second_log.exists()                 # it ran nothing
        assert time.monotonic() - t0 < 30              # at once, not after a timeout
        # a second driver in this process is refused too
        with pytest.raises(CheckpointError, match=rf"in use by another driver: pid "
                                                  rf"{first.pid}"):
            IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
        gate.touch()
        out, err = first.communicate(timeout=90)
        assert first.returncode == 0 and out.startswith("DONE"), err
    finally:
        _kill(first, *([second] if second else []))
    done = first_log.read_text().split()
    assert len(done) == len(set(done))                 # nothing ran twice
    assert sorted(_each_once(path)) == sorted(done)
    assert (tmp_path / "loop.jsonl.lock").read_text() == ""    # released when it ended
    # once the first is gone, the journal is free again
    report = IterationScheduler.resume(path, cs.LoggingRunner(None, 0.0),
                                       expander=cs.EXPANDER, progress=False).run()
    assert report.dispatched == 0 and report.replayed == len(done)


@pytest.mark.timeout(120, method="thread")
def test_a_frozen_driver_loses_its_lock_and_stops_without_writing(tmp_path):
    path = tmp_path / "loop.jsonl"
    env = {"DASK_RESEARCH__EXPERIMENTS__LOCK_TIMEOUT": "1.0"}
    first, first_log = _driver(tmp_path, "first", path, delay=0.1, env=env)
    second = None
    try:
        _wait_results(path, 3, first)
        os.kill(first.pid, signal.SIGSTOP)             # frozen: no heartbeat
        time.sleep(0.3)
        size = path.stat().st_size
        with dask.config.set({"research.experiments.lock-timeout": 1.0}):
            with pytest.raises(CheckpointError, match="in use by another driver"):
                IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)  # fresh
        assert path.stat().st_size == size
        time.sleep(1.5)
        second, second_log = _driver(tmp_path, "second", path, delay=0.0, env=env)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0 and out.startswith("DONE"), (out, err)
        assert "took over the lock of pid" in err and "heartbeat is older than 1 s" in err
        finished = path.read_bytes()
        os.kill(first.pid, signal.SIGCONT)             # wakes up, finds the lock gone
        out, err = first.communicate(timeout=60)
        assert first.returncode == 3, (out, err)
        assert "this driver's lock was taken over by pid" in out
        assert path.read_bytes() == finished           # it wrote nothing after waking
    finally:
        _kill(first, *([second] if second else []))
    _each_once(path)


def _foreign(lock_path, **kw):
    holder = {"owner": "f" * 32, "host": "elsewhere", "pid": 1, "started": "then",
              "heartbeat": time.time()}
    holder.update(kw)
    pathlib.Path(lock_path).write_text(json.dumps(holder))


def test_stale_and_live_locks_of_other_hosts(tmp_path):
    path = tmp_path / "loop.jsonl"
    _foreign(str(path) + ".lock")                      # live: fresh heartbeat elsewhere
    with pytest.raises(CheckpointError, match=r"in use by another driver: pid 1 on host "
                                              r"elsewhere .*heartbeat 0\.\d s ago"):
        IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
    _foreign(str(path) + ".lock", heartbeat=time.time() - 31)
    with pytest.warns(JournalLockWarning, match=r"took over the lock of pid 1 on host "
                                                r"elsewhere .* heartbeat is older than 30 s"):
        sched = IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
    sched.add([Hypothesis("h1", "a")])
    assert sched.run().total_runs == 1
    # a dead pid on this host is stale at once, whatever its heartbeat
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    _foreign(str(path) + ".lock", host=socket.gethostname(), pid=int(dead))
    with pytest.warns(JournalLockWarning, match=rf"pid {dead} is no longer running"):
        IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False).close()


def test_a_released_lock_is_taken_again_only_if_nobody_wrote(tmp_path):
    path = tmp_path / "loop.jsonl"
    sched = IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
    sched.add([Hypothesis("h1", "a")])
    sched.run()                                        # released when the run ended
    sched.add([Hypothesis("h2", "a")])                 # taken again: nobody wrote
    assert sched.run().total_runs == 1 and sched.stats["a"].runs == 2
    other = IterationScheduler.resume(path, lambda h: 0.5, progress=False)
    other.add([Hypothesis("h3", "a")])
    other.run()
    with pytest.raises(CheckpointError, match=r"changed since this scheduler read it .* "
                                              r"another driver wrote to it"):
        sched.add([Hypothesis("h4", "a")])
    assert [h for h in _each_once(path)] == ["h1", "h2", "h3"]


def test_a_lock_taken_over_in_flight_stops_the_run(tmp_path):
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.lock-timeout": 0.4}):
        calls = []

        def runner(h):
            calls.append(h.id)
            if len(calls) == 2:                       # another driver takes over meanwhile
                _foreign(str(path) + ".lock", host=socket.gethostname(), pid=os.getpid())
                time.sleep(0.3)
            return 0.5

        sched = IterationScheduler(runner, slots=1, checkpoint=path, progress=False)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(5)])
        with pytest.raises(CheckpointError, match=rf"this driver's lock was taken over by pid "
                                                  rf"{os.getpid()} on host "
                                                  rf"{socket.gethostname()}"):
            sched.run()
    assert len(calls) == 2 and _each_once(path) == ["h0"]
    assert JournalLock(str(path)).stale_reason(json.loads(
        (tmp_path / "loop.jsonl.lock").read_text())) is None


def test_a_journal_in_a_folder_that_cannot_hold_its_lock_is_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match=r"file/loop.jsonl: cannot lock it: .*"
                                              r"loop.jsonl.lock: .*must be writable"):
        IterationScheduler(lambda h: 0.5, checkpoint=blocker / "loop.jsonl", progress=False)
