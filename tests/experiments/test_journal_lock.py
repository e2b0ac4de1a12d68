"""One driver per journal, through the journal's durable.Lease, on real processes and files.

A second driver is refused, naming the holder; a stale lease (its process gone on this host, or
unchanged for ``research.experiments.lock-timeout`` of the waiting process's own clock, whatever
heartbeat it claims) is taken over; a driver frozen until it was taken over stops when it wakes
and names the driver that holds the journal now; lock files of the previous version hold
nothing; links planted where the lease or its lock file go are refused, their targets untouched.

Every wait here is for an event, with a generous bound; the only times asserted are lower
bounds measured by the waiting process's own clock.
"""
import getpass
import json
import math
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
from dask_research.testing.threads import in_thread

HERE = pathlib.Path(__file__).resolve().parent
BOUND = 120.0             # generous bound on any one wait for an event
HOST = socket.gethostname()

DRIVER = """
import asyncio, os, sys
sys.path.insert(0, {tests!r})
import crash_scenario as cs
from dask_research.exceptions import CheckpointError


class Gated(cs.LoggingRunner):
    # after 4 experiments, each says it waits and waits until the test creates the gate file
    async def __call__(self, h):
        if len(self.calls) >= 4 and not os.path.exists({gate!r}):
            open({log!r} + ".waiting-" + h.id, "w").close()
            while not os.path.exists({gate!r}):
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


def _wait(what, done, *procs, bound=BOUND):
    deadline = time.monotonic() + bound
    while not done():
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a driver ended before {what}: {p.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {bound} s")
        time.sleep(0.01)


def _results(path):
    return path.read_text().count('"kind": "result"') if path.exists() else 0


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


def _freeze(proc, lock_path):
    """SIGSTOP ``proc`` outside its heartbeat's brief flock of ``lock_path``.

    A process frozen *inside* that flock (held for the milliseconds of one beat) keeps every
    other driver from taking its lease over until it is stopped or resumed: the taker says so
    after 30 s ("... that process is stuck: stop it"). That is the durable layer's rule; this
    test is about a driver frozen between beats, so it freezes it there (seen in /proc/locks).
    """
    inode = os.stat(lock_path).st_ino
    deadline = time.monotonic() + BOUND
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        with open("/proc/locks") as f:
            held = any("FLOCK" in line and f" {proc.pid} " in line and line.split()[5].endswith(f":{inode}")
                       for line in f)
        if not held:
            return
        os.kill(proc.pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            pytest.fail(f"the driver held its lock file at every try for {BOUND} s")
        time.sleep(0.01)


def _forge(path, **kw):
    """A lease as another driver would have written it (or a forger: any field may be odd)."""
    holder = {"format": "dask-research.experiments.journal-lease/1", "token": "f" * 32,
              "owner": "mallory", "host": "elsewhere", "pid": 1, "started": time.time(),
              "heartbeat": time.time(), "beats": 1}
    holder.update(kw)
    tmp = pathlib.Path(f"{path}.forging")
    tmp.write_text(json.dumps(holder))
    os.replace(tmp, path)             # whole, as a lease is written: a reader never sees it half-written


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_second_driver_process_is_refused_naming_the_holder(tmp_path):
    path = tmp_path / "loop.jsonl"
    gate = tmp_path / "closed-gate"                    # the first waits after 4 experiments
    first, first_log = _driver(tmp_path, "first", path, delay=0.01, gate=gate)
    second = None
    try:
        _wait("3 results", lambda: _results(path) >= 3, first)
        second, second_log = _driver(tmp_path, "second", path, delay=0.0)
        out, err = second.communicate(timeout=BOUND)
        assert second.returncode == 3, (out, err)
        # refused once it saw the holder's lease beat, naming the holder
        assert out.startswith(f"REFUSED checkpoint {path}: loop.jsonl.lease: the journal is held by "
                              f"{getpass.getuser()} on host {HOST}, pid {first.pid} "), out
        assert "whose lease is alive; one IterationScheduler per journal" in out
        assert not second_log.exists()                 # it ran nothing
        # a second driver in this process is refused too
        with pytest.raises(CheckpointError, match=rf"held by \S+ on host {HOST}, pid {first.pid} .*alive"):
            IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
        gate.touch()
        out, err = first.communicate(timeout=BOUND)
        assert first.returncode == 0 and out.startswith("DONE"), err
    finally:
        _kill(first, *([second] if second else []))
    done = first_log.read_text().split()
    assert len(done) == len(set(done))                 # nothing ran twice
    assert sorted(_each_once(path)) == sorted(done)
    assert not (tmp_path / "loop.jsonl.lease").exists()    # released when it ended
    # once the first is gone, the journal is free again
    report = IterationScheduler.resume(path, cs.LoggingRunner(None, 0.0),
                                       expander=cs.EXPANDER, progress=False).run()
    assert report.dispatched == 0 and report.replayed == len(done)


@pytest.mark.timeout(300, method="thread")
def test_a_second_driver_in_this_process_is_refused_at_once(tmp_path):
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.lock-timeout": 3600.0}):
        first = IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
        try:
            # at once: not after a heartbeat (15 min here) nor the timeout (an hour)
            t, out = in_thread(lambda: IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False),
                               join=BOUND)
            assert not t.is_alive()
            assert isinstance(out.get("error"), CheckpointError), out
            assert "already held by another writer in this process" in str(out["error"])
        finally:
            first.close()
        IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False).close()   # free again


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("taker", ["holding", "finished"])
def test_a_frozen_driver_is_taken_over_and_when_it_wakes_names_the_new_holder(tmp_path, taker):
    """Woken while the driver that took over holds the journal, or after it finished: either way
    it stops without writing and names that driver (pid, host), never "pid None on host None"."""
    path = tmp_path / "loop.jsonl"
    env = {"DASK_RESEARCH__EXPERIMENTS__LOCK_TIMEOUT": "1.0"}
    first, _ = _driver(tmp_path, "first", path, delay=0.1, env=env)
    gate = tmp_path / ("closed-gate" if taker == "holding" else "open-gate")
    second = None
    try:
        _wait("3 results", lambda: _results(path) >= 3, first)
        _freeze(first, tmp_path / "loop.jsonl.lock")   # frozen: its lease stops changing
        second, second_log = _driver(tmp_path, "second", path, delay=0.0, env=env, gate=gate)
        if taker == "holding":                         # it runs 4 experiments, both slots then wait
            _wait("the second driver waiting at its gate",
                  lambda: len(list(tmp_path.glob("second.log.waiting-*"))) == 2, second)
        else:
            s_out, s_err = second.communicate(timeout=BOUND)
            assert second.returncode == 0 and s_out.startswith("DONE"), (s_out, s_err)
        quiet = path.read_bytes()
        os.kill(first.pid, signal.SIGCONT)             # wakes up, finds its lease gone
        out, err = first.communicate(timeout=BOUND)
        assert first.returncode == 3, (out, err)
        assert "lost the lease of the journal (presumed dead and taken over" in out, out
        named = f"{getpass.getuser()} on host {HOST}, pid {second.pid} "
        assert (f"held now by {named}" if taker == "holding" else
                f"it was taken over by {named}") in out, out
        assert "None" not in out
        assert path.read_bytes() == quiet              # it wrote nothing after waking
        if taker == "holding":
            gate.touch()
            s_out, s_err = second.communicate(timeout=BOUND)
            assert second.returncode == 0 and s_out.startswith("DONE"), (s_out, s_err)
        assert (f"loop.jsonl.lease: taking over the lease of the journal held by {getpass.getuser()} on "
                f"host {HOST}, pid {first.pid}") in s_err and "has not changed for " in s_err
    finally:
        _kill(first, *([second] if second else []))
    _each_once(path)


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("heartbeat", ["future", "nan", "hour-ahead", "huge"])
def test_a_forged_or_skewed_heartbeat_is_stale_after_the_timeout_of_the_waiters_clock(tmp_path, heartbeat):
    path = tmp_path / "loop.jsonl"
    beat = {"future": time.time() + 10 * 365 * 86400, "nan": math.nan, "hour-ahead": time.time() + 3600,
            "huge": 1e308}[heartbeat]
    _forge(str(path) + ".lease", heartbeat=beat)
    _forge(str(path) + ".lock", heartbeat=beat)        # where the previous version kept its lock
    with dask.config.set({"research.experiments.lock-timeout": 1.0}):
        with pytest.warns(JournalLockWarning, match=r"loop.jsonl.lease: taking over the lease of the journal "
                                                    r"held by mallory on host elsewhere, pid 1 .*has not "
                                                    r"changed for \d+ s by this process's clock"):
            t0 = time.monotonic()
            t, out = in_thread(lambda: IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False),
                               join=BOUND)
            assert not t.is_alive() and "error" not in out, out
            assert time.monotonic() - t0 >= 1.0        # not before the timeout, by our own clock
    sched = out["result"]
    sched.add([Hypothesis("h1", "a")])
    assert sched.run().total_runs == 1


@pytest.mark.timeout(300, method="thread")
def test_a_live_driver_of_another_host_is_refused(tmp_path):
    """A lease that keeps changing is alive, whoever and wherever its holder is."""
    path = tmp_path / "loop.jsonl"
    lease = str(path) + ".lease"
    _forge(lease)
    stop = []

    def beat():
        n = 1
        while not stop:
            n += 1
            _forge(lease, beats=n)
            time.sleep(0.05)

    beater, _ = in_thread(beat)
    try:
        with dask.config.set({"research.experiments.lock-timeout": 30.0}):
            with pytest.raises(CheckpointError, match=r"the journal is held by mallory on host elsewhere, pid 1 "
                                                      r".*whose lease is alive"):
                IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
    finally:
        stop.append(True)
        beater.join(BOUND)
    assert json.loads(pathlib.Path(lease).read_text())["owner"] == "mallory"     # not taken over


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("old", ["empty", "dead-here", "elsewhere-future"])
def test_lock_files_of_the_previous_version_hold_nothing(tmp_path, old):
    """``loop.jsonl.lock`` as the previous version left it is only the lease's flock file now."""
    path = tmp_path / "loop.jsonl"
    cs.scheduler(cs.LoggingRunner(None, 0.0), path, max_experiments=3).run()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    record = {"owner": "0" * 32, "host": HOST if old == "dead-here" else "elsewhere", "pid": int(dead),
              "started": "2026-01-01T00:00:00+0000", "journal": str(path), "timeout": 30.0,
              "heartbeat": time.time() + (3600 * 24 * 365 if old == "elsewhere-future" else 0)}
    content = b"" if old == "empty" else json.dumps(record).encode()
    lock = tmp_path / "loop.jsonl.lock"
    lock.write_bytes(content)
    with dask.config.set({"research.experiments.lock-timeout": 3600.0}):
        # at once: the previous version's lock file is not a lease to wait for (an hour here)
        t, out = in_thread(lambda: IterationScheduler.resume(path, cs.LoggingRunner(None, 0.0),
                                                             expander=cs.EXPANDER, progress=False,
                                                             max_experiments=None), join=BOUND)
        assert not t.is_alive() and "error" not in out, out
    report = out["result"].run()
    assert report.replayed == 3 and report.stop_reason == "queue_empty"
    assert lock.read_bytes() == content                # never read, never written


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


def test_a_lease_taken_over_in_flight_stops_the_run_naming_the_new_holder(tmp_path):
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.lock-timeout": 0.4}):
        calls = []

        def runner(h):
            calls.append(h.id)
            if len(calls) == 2:                       # another driver takes over meanwhile
                _forge(str(path) + ".lease", owner="bob", host=HOST, pid=os.getpid())
                time.sleep(0.3)
            return 0.5

        sched = IterationScheduler(runner, slots=1, checkpoint=path, progress=False)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(5)])
        with pytest.raises(CheckpointError, match=rf"lost the lease of the journal .*held now by bob on host "
                                                  rf"{HOST}, pid {os.getpid()} "):
            sched.run()
    assert len(calls) == 2 and _each_once(path) == ["h0"]
    assert json.loads((tmp_path / "loop.jsonl.lease").read_text())["owner"] == "bob"   # left to its holder


@pytest.mark.parametrize("name", ["loop.jsonl.lock", "loop.jsonl.lease"])
def test_a_lock_or_lease_linked_to_a_user_file_is_refused_and_the_file_untouched(tmp_path, name):
    victim = tmp_path / "thesis.tex"
    victim.write_bytes(b"\\chapter{Results} months of work\n")
    (tmp_path / name).symlink_to(victim)
    path = tmp_path / "loop.jsonl"
    with pytest.raises(CheckpointError, match=rf"checkpoint {path}: {name}: is a symbolic link; links "
                                              r"inside it are refused, never followed"):
        IterationScheduler(lambda h: 0.5, checkpoint=path, progress=False)
    assert victim.read_bytes() == b"\\chapter{Results} months of work\n"
    assert not path.exists() and (tmp_path / name).is_symlink()


def test_a_journal_in_a_folder_that_cannot_exist_is_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match=rf"checkpoint {blocker}/loop.jsonl: {blocker}: is a file, not a "
                                              r"directory"):
        IterationScheduler(lambda h: 0.5, checkpoint=blocker / "loop.jsonl", progress=False)
    assert blocker.read_text() == "not a folder"


def test_a_bad_lock_timeout_is_one_clear_error(tmp_path):
    with dask.config.set({"research.experiments.lock-timeout": float("nan")}):
        with pytest.raises(CheckpointError, match=r"research.experiments.lock-timeout=nan is invalid; expected "
                                                  r"a positive, finite number of seconds"):
            JournalLock(tmp_path / "loop.jsonl")


def test_a_remote_journal_has_one_driver_too(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = "memory://dask-research-lock-test/loop.jsonl"
    fs = fsspec.filesystem("memory")
    first = IterationScheduler(lambda h: 0.5, checkpoint=url, progress=False)
    try:
        with pytest.raises(CheckpointError, match="already held by another writer in this process"):
            IterationScheduler(lambda h: 0.5, checkpoint=url, progress=False)
        assert fs.exists(url + ".lease")
    finally:
        first.close()
    assert not fs.exists(url + ".lease")
    if fs.exists(url):
        fs.rm(url)
