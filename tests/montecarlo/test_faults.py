"""Faults with real processes: a SIGKILLed `dask worker`, a SIGKILLed client."""
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research._cluster import workers_info
from dask_research.testing.pipelines import slow_tanh  # importable by `dask worker` processes
from dask_research.testing.processes import dask_processes, wait_for
from dask_research.testing.threads import in_thread


def _job(shards=48):
    return mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=shards,
                  samples_per_shard=1024, seed=5, bins=32, range=(0.0, 1.0))


_wait_for = wait_for


def _stored(store: pathlib.Path, job) -> int:
    d = store / "runs" / job.id / "shards"
    return len(mc.RunStore(str(store)).read_shards(job.id)) if d.exists() else 0


@pytest.fixture
def real_cluster(tmp_path):
    """A `dask scheduler` and two `dask worker` processes (no nanny: a kill is final)."""
    with dask_processes(tmp_path, 2) as (client, workers):
        yield client, workers


def _reference(job):
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        return mc.run(job, client=c, verify=0, progress=False)


@pytest.mark.slow
def test_sigkill_a_worker_mid_run_loses_nothing_and_changes_no_bit(real_cluster, tmp_path):
    client, workers = real_cluster
    job = _job()
    store = tmp_path / "store"
    t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=2, progress=False,
                                      shards_per_task=2))
    _wait_for(lambda: "error" in out or _stored(store, job) >= 12, 60, "a quarter of the shards")
    assert "error" not in out, out.get("error")
    victim = workers[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    t.join(timeout=120)
    assert "error" not in out, out.get("error")
    res = out["result"]
    ref = _reference(job)
    assert res.state == ref.state                                 # bit-identical
    assert res.n == 48 * 1024 and int(res.state.hist.sum()) == res.n  # nothing lost, nothing twice
    stored = mc.RunStore(str(store)).read_shards(job.id)          # raises on a repeated shard
    assert sorted(stored) == list(range(48))
    assert len(workers_info(client)) == 1


CLIENT_SCRIPT = textwrap.dedent('''
    import sys, time
    import numpy as np
    from dask_research import montecarlo as mc

    def slow_tanh(a, b):
        time.sleep(0.05)
        return np.tanh(a * b)

    job = mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=48,
                 samples_per_shard=1024, seed=5, bins=32, range=(0.0, 1.0))

    if __name__ == "__main__":
        mc.run(job, store=sys.argv[1], verify=0, progress=False, shards_per_task=1)
''')


@pytest.mark.slow
def test_sigkill_the_client_then_resume_computes_only_the_missing_shards(tmp_path):
    script = tmp_path / "client_job.py"
    script.write_text(CLIENT_SCRIPT)
    store = tmp_path / "store"
    from dask_research.cli import load_object

    job = load_object(f"{script}:job")
    proc = subprocess.Popen([sys.executable, str(script), str(store)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _stored(store, job) >= 16, 60, "a third of the shards")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = _stored(store, job)
    assert 16 <= before < 48
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        resumed = mc.run(job, client=c, store=str(store), verify=0, progress=False)
    assert resumed.computed_shards == 48 - before and resumed.reused_shards == before
    ref = _reference(job)
    assert resumed.state == ref.state
