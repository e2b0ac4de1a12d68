"""One writer per run: two real client processes running the same job into the same store.

The first holds ``runs/<id>/lease.json``; the second says which run holds it (owner, host, pid),
waits, then resumes from what the first stored, so it computes nothing and returns the same
bits. A holder killed with SIGKILL leaves a stale lease that the next run takes over at once.
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import StoreError
from dask_research.testing.processes import wait_for

from .store_helpers import BOUND, steal_lease
from .test_store import one_worker  # noqa: F401 - fixture

JOB_FILE = '''
import os
import time

import numpy as np
from dask_research import montecarlo as mc


def held(a, b):
    # With MC_GATE set, shards (not the pilot: the manifest is written after it) say so in
    # MC_ENTERED and wait until the test opens the gate.
    gate, manifest = os.environ.get("MC_GATE"), os.environ.get("MC_MANIFEST")
    if gate and manifest and os.path.exists(manifest):
        open(os.environ["MC_ENTERED"], "a").close()
        t0 = time.time()
        while not os.path.exists(gate) and time.time() - t0 < 120:
            time.sleep(0.02)
    return np.tanh(a * b)


job = mc.Job(held, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.3)}, shards=16,
             samples_per_shard=1024, seed=3, bins=16, name="leased")
'''

RUNNER = '''
import json, sys
from dask_research import montecarlo as mc
from dask_research.cli import load_object

job = load_object(sys.argv[1] + ":job")
res = mc.run(job, store=sys.argv[2], shards_per_task=int(sys.argv[3]), progress=False, verify=0)
print("RESULT " + json.dumps({"computed": res.computed_shards, "reused": res.reused_shards,
                              "mean": float(res.mean).hex(), "n": res.n}), flush=True)
'''


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(pathlib.Path(mc.__file__).parents[2]),
                                                    env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


class Proc:
    """A runner subprocess whose stderr is collected by a thread (so a test can wait for a line)."""

    def __init__(self, tmp, store, spt, **env):
        self.p = subprocess.Popen([sys.executable, str(tmp / "runner.py"), str(tmp / "job.py"), str(store), str(spt)],
                                  cwd=tmp, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self._t = threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True)
        self._t.start()

    def wait_for(self, text, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if any(text in line for line in self.err):
                return next(line for line in self.err if text in line)
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in stderr: {''.join(self.err)[-3000:]}")

    def result(self, timeout=180):
        out = self.p.stdout.read()          # stderr is the reader thread's (communicate would steal it)
        self.p.wait(timeout)
        self._t.join(10)
        assert self.p.returncode == 0, "".join(self.err)[-3000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        return json.loads(line[len("RESULT "):])

    def kill(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(30)
        self._t.join(10)
        for stream in (self.p.stdout, self.p.stderr):
            stream.close()


def _wait_file(path, timeout=120):
    t0 = time.time()
    while not path.exists():
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.05)


@pytest.fixture
def leased(tmp_path):
    (tmp_path / "job.py").write_text(JOB_FILE)
    (tmp_path / "runner.py").write_text(RUNNER)
    from dask_research.cli import load_object

    job = load_object(f"{tmp_path / 'job.py'}:job")
    store = tmp_path / "store"
    lease = store / "runs" / job.id / "lease.json"
    return tmp_path, job, store, lease


def _start_gated(tmp, store, job, gate, procs):
    """Start a run that holds still, once computing, until ``gate`` exists; it joins ``procs``
    (which the test kills at the end) and is returned once it is computing shards."""
    first = Proc(tmp, store, 4, MC_GATE=str(gate), MC_MANIFEST=str(store / "runs" / job.id / "manifest.json"),
                 MC_ENTERED=str(tmp / "entered"))
    procs.append(first)
    _wait_file(tmp / "entered")
    return first


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_second_client_waits_for_the_first_then_resumes_without_computing(leased):
    tmp, job, store, lease = leased
    gate = tmp / "gate"
    procs = []
    try:
        first = _start_gated(tmp, store, job, gate, procs)     # the first run is computing shards
        second = Proc(tmp, store, 8)       # another task size, as another cluster's pilot may pick
        procs.append(second)
        said = second.wait_for("waiting for it")
        holder = json.loads(lease.read_text())
        assert holder["pid"] == first.p.pid and holder["host"] == socket.gethostname()
        assert f"run {job.id[:12]} in {store} is held by" in said and "resumes from what it stored" in said
        assert f"pid {first.p.pid}" in said and socket.gethostname() in said
        gate.write_text("open")
        a, b = first.result(), second.result()
    finally:
        for p in procs:
            p.kill()
    assert a["computed"] == 16 and a["reused"] == 0
    assert b["computed"] == 0 and b["reused"] == 16          # resumed from the first run's shards
    assert a["mean"] == b["mean"] and a["n"] == b["n"] == job.total_samples
    names = sorted(p.name for p in (store / "runs" / job.id / "shards").iterdir())
    assert len(names) == 4 and all(n.endswith(".json") for n in names)   # only the first writer's files
    assert mc.show(job.id, str(store))["complete"] and not lease.exists()
    assert sum(1 for line in second.err if "waiting for it" in line) == 1


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_killed_holder_leaves_a_stale_lease_that_is_taken_over(leased):
    tmp, job, store, lease = leased
    procs = []
    try:
        first = _start_gated(tmp, store, job, tmp / "never", procs)
        first.kill()                                             # SIGKILL: no release, no cleanup
        assert lease.exists()
        second = Proc(tmp, store, 4)
        procs.append(second)
        b = second.result()
    finally:
        for p in procs:
            p.kill()
    assert any("taking over the lease of run" in line and f"pid {first.p.pid}" in line and "is gone" in line
               for line in second.err), second.err
    assert b["computed"] == 16 and b["n"] == job.total_samples
    assert mc.show(job.id, str(store))["complete"] and not lease.exists()


def test_a_live_holder_is_named_and_lease_wait_bounds_the_wait(leased, one_worker):
    tmp, job, store, lease = leased
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lease.parent.mkdir(parents=True)
        lease.write_text(json.dumps({"owner": "alice", "host": socket.gethostname(), "pid": sleeper.pid,
                                     "started": time.time(), "heartbeat": time.time(), "token": "x"}))
        import dask

        with dask.config.set({"research.montecarlo.lease-wait": 0.5}):
            with pytest.raises(StoreError, match=rf"is held by alice on host .*, pid {sleeper.pid} "
                                                 r".*gave up after waiting \d+ s; research.montecarlo.lease-wait"):
                mc.run(job, client=one_worker, store=str(store), progress=False, verify=0)
        # The same lease on another host, unchanged for lease-timeout seconds of our own clock
        # (its heartbeat's timestamp is never trusted): stale, taken over.
        doc = json.loads(lease.read_text())
        doc["heartbeat"] = time.time() - 3600
        doc["host"] = "another-host"
        lease.write_text(json.dumps(doc))
        with dask.config.set({"research.montecarlo.lease-timeout": 1.0}):
            res = mc.run(job, client=one_worker, store=str(store), progress=False, verify=0)
        assert res.computed_shards == 16 and not lease.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_heartbeat_refreshes_the_lease_and_a_holder_that_lost_it_stops(tmp_path):
    """Events, not wall times: the heartbeat is seen to change the lease; once another holder
    took it over (as a taker does, under lease.lock), the old holder notices and never writes it again."""
    import dask

    rs = mc.RunStore(str(tmp_path / "store"))
    rid = "ab" * 32
    with dask.config.set({"research.montecarlo.lease-timeout": 0.4}):
        lease = rs.lease(rid).acquire()
        try:
            first = lease.holder()
            assert first["format"] == "dask-research-lease/1" and first["run_id"] == rid
            wait_for(lambda: lease.holder()["beats"] > first["beats"], BOUND, "a heartbeat")
            again = lease.holder()
            assert again["token"] == lease.token and again["heartbeat"] >= first["heartbeat"]
            path = pathlib.Path(lease.path)
            stolen = steal_lease(path, owner="bob", heartbeat=1.0)
            wait_for(lambda: not lease.held, BOUND, "the old holder to notice it lost the lease")
            with pytest.raises(StoreError, match="not written: this writer lost the lease of run ababababab.*held now by bob"):
                rs.write_result(rid, {"mean": 1.0})
            assert json.loads(path.read_text()) == stolen          # never written again by the old holder
        finally:
            lease.release()
        assert json.loads(pathlib.Path(lease.path).read_text()) == stolen   # release never removes another's lease


def test_a_lease_on_an_object_store_protocol(tmp_path):
    rs = mc.RunStore("memory://lease-test-store")
    rid = "cd" * 32
    said = []
    with rs.lease(rid, announce=said.append) as lease:
        assert rs.fs.exists(lease.path) and lease.holder()["pid"] == os.getpid()
        other = rs.lease(rid, wait=0.3, announce=said.append)
        with pytest.raises(StoreError, match=r"run cdcdcdcdcdcd in memory://lease-test-store is held by .*gave up"):
            other.acquire()
    assert not rs.fs.exists(lease.path) and len(said) == 1 and "waiting for it" in said[0]


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_run_whose_lease_was_taken_over_stops_writing(leased):
    """A holder presumed dead (its lease replaced by another run's) writes no shard when it wakes."""
    tmp, job, store, lease = leased
    gate = tmp / "gate"
    procs = []
    try:
        first = _start_gated(tmp, store, job, gate, procs)     # computing its first blocks, nothing stored yet
        taken = {**json.loads(lease.read_text()), "token": "thief", "owner": "bob", "pid": 1}
        tmp_lease = lease.with_name("lease.json.swap")
        tmp_lease.write_text(json.dumps(taken))
        os.replace(tmp_lease, lease)                       # as a taker does: the whole file at once
        gate.write_text("open")
        first.p.wait(180)
        first._t.join(10)
    finally:
        for p in procs:
            p.kill()
    err = "".join(first.err)
    assert first.p.returncode != 0, err[-3000:]
    assert "not written: this writer lost the lease of run" in err and "held now by bob" in err, err[-3000:]
    shards = store / "runs" / job.id / "shards"
    assert not shards.exists() or not any(p.name.endswith(".json") for p in shards.iterdir())
    assert json.loads(lease.read_text())["token"] == "thief"     # never removed or overwritten
