"""Hangs and faults with real processes: a hung shard, a frozen (SIGSTOP) worker, a lost
scheduler, a pipeline that fails on one worker or on all of them.

Every process started here is killed by its pid in ``finally`` (a stopped one is continued
first), and every test has a thread-method timeout, so none can hang the suite.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import time

import dask
import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research._cluster import workers_info
from dask_research.exceptions import PipelineError, ResearchError
from dask_research.testing import faults
from dask_research.testing.pipelines import slow_tanh
from dask_research.testing.processes import WorkerSpec, process_cluster, wait_for
from dask_research.testing.threads import in_thread

TOPIC = "research.montecarlo"


@contextlib.contextmanager
def real_cluster(tmp_path: pathlib.Path, worker_envs: list[dict], nthreads: int = 1):
    """A `dask scheduler` and one `dask worker` (no nanny) per entry of ``worker_envs`` (added to
    its environment); yields ``(client, scheduler_proc, worker_procs)``."""
    with process_cluster(tmp_path, [WorkerSpec(env=e) for e in worker_envs], nthreads=nthreads) as cluster:
        yield cluster.client, cluster.scheduler, cluster.workers


def _stored(store: pathlib.Path, job) -> int:
    d = store / "runs" / job.id / "shards"
    return len(mc.RunStore(str(store)).read_shards(job.id)) if d.exists() else 0


def _reference(job):
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        return mc.run(job, client=c, verify=0, progress=False)


def _events(client) -> list[dict]:
    return [m for _, m in client.get_events(TOPIC)]


# -- a hung shard ------------------------------------------------------------------------------

def _hang_job():
    job = mc.Job(faults.hang_on_marked, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=24,
                 samples_per_shard=512, seed=6, bins=32, range=(0.0, 1.0))
    assert faults.marked_shards(job) == [10]
    return job


#: The block timeout of the hung-shard test. Every other block is 512 samples (milliseconds of
#: work), but a block also holds its worker's first imports and the store's fsyncs, which take
#: seconds on a loaded machine: a 3 s timeout failed the run on a slow shard 0 before the hung
#: shard 10 was due. 30 s is far above any healthy block and far below the hang (600 s).
HUNG_BLOCK_TIMEOUT = 30.0


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_hung_shard_fails_the_run_naming_it_and_the_stored_shards_resume(tmp_path):
    assert not os.environ.get(faults.HANG_ENV)          # this process (pilot, resume) never hangs
    job, store = _hang_job(), tmp_path / "store"
    hang = {faults.HANG_ENV: "1"}
    with real_cluster(tmp_path, [hang, hang]) as (client, _, _):
        with dask.config.set({"research.montecarlo.block-timeout": HUNG_BLOCK_TIMEOUT}):
            t0 = time.monotonic()
            t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=0,
                                               progress=False, shards_per_task=1))
            t.join(180)
            elapsed = time.monotonic() - t0
        assert not t.is_alive(), "the run hung"
        err = out.get("error")
        assert isinstance(err, PipelineError), out
        msg = str(err)
        assert err.shard == "10" and msg.startswith("pipeline output of shard 10: did not return within ")
        assert "s on worker tcp://127.0.0.1:" in msg and f"block-timeout allows {HUNG_BLOCK_TIMEOUT:.1f} s" in msg
        assert "thread cannot be killed" in msg and "resumes" in msg
        # It waited for the timeout (by this process's own clock), not for the hang to end.
        assert HUNG_BLOCK_TIMEOUT <= elapsed < faults.HANG_SECONDS
        events = _events(client)
        # At most one speculative copy of the hung block, then speculation stops for the run.
        copies = [m for m in events if m["event"] == "speculate" and m["start"] == 10]
        assert len(copies) <= 1
        if copies:   # the copy hung too: the shard is slow, not the worker, so no more copies
            assert [m for m in events if m["event"] == "speculate-stopped" and m["start"] == 10]

        def failed():
            return [m for m in _events(client) if m["event"] == "failed" and m["run"] == job.id]

        wait_for(failed, 30, "the run's failed event")     # a failing run waits at most 1 s for its log
        assert "shard 10" in failed()[-1]["reason"] and failed()[-1]["error"] == "PipelineError"
    stored = _stored(store, job)
    assert 0 < stored < 24
    # The same job on a healthy cluster computes only what is missing, and the same bits.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        resumed = mc.run(job, client=c, store=str(store), verify=0, progress=False)
    assert resumed.reused_shards == stored and resumed.computed_shards == 24 - stored
    assert resumed.state == _reference(job).state


# -- a frozen worker ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("window", [None, 4], ids=["blocks", "groups"])   # a window of 4: groups of 2
def test_a_frozen_worker_does_not_hold_the_run_its_checks_move(tmp_path, window):
    job = mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=48,
                 samples_per_shard=1024, seed=5, bins=32, range=(0.0, 1.0))
    store = tmp_path / "store"
    with real_cluster(tmp_path, [{}, {}]) as (client, _, workers):
        frozen = workers[0]
        frozen_at = next(w for w, info in workers_info(client).items() if info["name"] == "w0")
        t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=4, progress=False,
                                           shards_per_task=2, window=window))
        wait_for(lambda: "error" in out or _stored(store, job) >= 16, 90, "a third of the shards")
        assert "error" not in out, out.get("error")
        frozen.send_signal(signal.SIGSTOP)
        try:
            t.join(120)                    # Dask's worker TTL (5 minutes) is far away
            assert not t.is_alive(), "the run waited for the frozen worker"
            assert frozen.poll() is None   # still frozen: the run ended without it
        finally:
            frozen.send_signal(signal.SIGCONT)
    assert "error" not in out, out.get("error")
    res = out["result"]
    assert res.state == _reference(job).state
    assert sorted(mc.RunStore(str(store)).read_shards(job.id)) == list(range(48))
    v = res.verification
    assert v["moved"] >= 1 and v["checks"] == len(v["checked"]) >= 4
    # Every check was answered, and none by the frozen worker (a late check whose first worker
    # answered after all may keep it as its verifier: the first answer wins).
    assert all(c["match"] and c["verifier"] != frozen_at for c in v["checked"]), v
    assert any(frozen_at in c.get("moved_from", []) for c in v["checked"]), v


# -- a lost scheduler --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_a_lost_scheduler_says_the_stored_shards_are_kept_and_the_command_resumes(tmp_path):
    job = mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=48,
                 samples_per_shard=1024, seed=5, bins=32, range=(0.0, 1.0))
    store = tmp_path / "store"
    with real_cluster(tmp_path, [{}]) as (client, sched, _):
        t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=0, progress=False,
                                           shards_per_task=1))
        wait_for(lambda: "error" in out or _stored(store, job) >= 8, 90, "some shards")
        assert "error" not in out, out.get("error")
        sched.kill()
        sched.wait(10)
        t.join(90)
        assert not t.is_alive(), "the run hung after the scheduler died"
    err = out.get("error")
    assert type(err) is ResearchError, out
    stored = _stored(store, job)
    msg = str(err)
    assert "lost the connection to tcp://127.0.0.1:" in msg
    assert f"of 48 shards stored in {store}" in msg and "are kept" in msg and "run the same command again" in msg
    assert 8 <= stored < 48 and "\n" not in msg
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        resumed = mc.run(job, client=c, store=str(store), verify=0, progress=False)
    assert resumed.reused_shards == stored and resumed.state == _reference(job).state


# -- a pipeline failing on one worker, or on all ------------------------------------------------

def _broken_job():
    return mc.Job(faults.broken_here, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=16,
                  samples_per_shard=512, seed=3, bins=32, range=(0.0, 1.0))


@pytest.mark.timeout(240, method="thread")
def test_a_failure_on_one_worker_is_retried_on_another_with_the_same_bits(tmp_path):
    job = _broken_job()
    with real_cluster(tmp_path, [{faults.BROKEN_ENV: "1"}, {}]) as (client, _, _):
        broken = next(w for w, info in workers_info(client).items() if info["name"] == "w0")
        res = mc.run(job, client=client, verify=2, progress=False, shards_per_task=1)
        retries = [m for m in _events(client) if m["event"] == "retry" and m["run"] == job.id]
    assert res.state == _reference(job).state               # the retry computed the same bits
    assert retries and all(m["failed_on"] == broken for m in retries)
    assert all("ModuleNotFoundError" in m["error"] and f"on worker {broken}" in m["error"] for m in retries)
    assert broken not in res.workers                          # nothing was accepted from it


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_a_failure_on_every_worker_fails_naming_the_shard_and_the_workers(tmp_path):
    job = _broken_job()
    broken = {faults.BROKEN_ENV: "1"}
    with real_cluster(tmp_path, [broken, broken]) as (client, _, _):
        with pytest.raises(PipelineError) as info:
            mc.run(job, client=client, verify=0, progress=False, shards_per_task=1)
        workers = sorted(workers_info(client))
    msg = str(info.value)
    assert isinstance(info.value.shard, int) and msg.startswith(f"pipeline output of shard {info.value.shard}: ")
    assert "the pipeline raised ModuleNotFoundError: No module named 'fastmath_ext'" in msg
    assert f"failed on every worker tried ({', '.join(workers)})" in msg


def test_a_pipeline_exception_names_the_shard(loop):
    def boom(a):
        from distributed import get_worker

        try:
            get_worker()
        except ValueError:            # not on a worker: the pilot passes
            return a
        raise ZeroDivisionError("division by zero in my model")

    job = mc.Job(boom, {"a": mc.Normal(0, 1)}, shards=4, samples_per_shard=64, seed=1, range=(-5, 5))
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        with pytest.raises(PipelineError, match=r"^pipeline output of shard \d: the pipeline raised "
                           r"ZeroDivisionError: division by zero in my model \(in boom, "
                           r"(?:line \d+|test_hangs.py:\d+)\) "
                           r"\(on worker \w+://"):
            mc.run(job, client=c, verify=0, progress=False, shards_per_task=1)


# -- the limits themselves -----------------------------------------------------------------------

def test_auto_limits_follow_the_pilot_and_the_finished_blocks():
    from dask_research.montecarlo.engine import Execution

    job = _broken_job()
    reducer = job.make_reducer(job.range)
    limits = Execution(None, job, reducer, 4, run_id=job.id).limits
    assert limits.block_limit() is None and limits.check_limit() == 5.0   # nothing known: no block limit yet
    limits.shard_times.append(0.001)
    assert limits.block_limit() == 60.0                                       # fast blocks: the floor
    limits = Execution(None, job, reducer, 4, run_id=job.id, shard_seconds=2.0).limits  # the pilot: 2 s per shard
    assert limits.block_limit() == 20 * 2.0 * 4 and limits.check_limit() == 20 * 2.0
    limits.shard_times.extend([3.0, 3.0, 3.0])                                # blocks slower than the pilot
    assert limits.block_limit() == 20 * 3.0 * 4
    with dask.config.set({"research.montecarlo.block-timeout": "90s", "research.montecarlo.check-timeout": None}):
        limits = Execution(None, job, reducer, 4, run_id=job.id, shard_seconds=2.0).limits
        assert limits.block_limit() == 90.0 and limits.check_limit() is None


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_a_malformed_timeout_is_refused_naming_the_key(bad):
    from dask_research.exceptions import ConfigError
    from dask_research.montecarlo.engine import Execution

    job = _broken_job()
    with dask.config.set({"research.montecarlo.block-timeout": bad}):
        with pytest.raises(ConfigError, match=r"research\.montecarlo\.block-timeout=.* expected \"auto\", a positive"):
            Execution(None, job, job.make_reducer(job.range), 4, run_id=job.id)


@pytest.mark.timeout(120, method="thread")
def test_a_run_cancelled_from_outside_says_so(loop, tmp_path):
    from distributed import Future

    job = mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=48,
                 samples_per_shard=256, seed=5, bins=32, range=(0.0, 1.0))
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c, \
            Client(cl, set_as_default=False) as other:
        t, out = in_thread(lambda: mc.run(job, client=c, store=str(tmp_path), verify=0, progress=False,
                                           shards_per_task=1))
        wait_for(lambda: "error" in out or _stored(tmp_path, job) >= 4, 60, "some shards")
        keys = [k for k in cl.scheduler.tasks if str(k).startswith("mc-block-")]
        other.cancel([Future(k, other) for k in keys], force=True, reason="by-an-operator")
        t.join(60)
    assert not t.is_alive()
    err = out.get("error")
    assert type(err) is ResearchError, out
    assert "was cancelled from outside the run (reason: by-an-operator)" in str(err)
    assert "stored shards are kept" in str(err)


@pytest.mark.timeout(240, method="thread")
def test_auto_block_timeout_holds_from_the_first_block_with_the_pilots_figure(tmp_path):
    """One block holds every shard and hangs: with ``block-timeout: auto`` the limit comes from the
    pilot's time per shard, so the run fails instead of waiting for a block that never finishes."""
    job, store = _hang_job(), tmp_path / "store"
    hang = {faults.HANG_ENV: "1"}
    with real_cluster(tmp_path, [hang]) as (client, _, _):
        with dask.config.set({"research.montecarlo.block-timeout": "auto",
                              "research.montecarlo.block-timeout-min": 2.0,
                              "research.montecarlo.timeout-factor": 2.0,
                              "research.montecarlo.speculate": 0}):
            t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=0,
                                               progress=False, shards_per_task=32))   # one block
            t.join(120)
        assert not t.is_alive(), "the run waited for a block that never finishes"
        err = out.get("error")
        assert isinstance(err, PipelineError) and "did not return within" in str(err), out


# -- a frozen worker in a long run -------------------------------------------------------------

#: The block timeout of the long frozen-worker run: far above a healthy block of it (8 shards of
#: 4 ms), far below the tail after the freeze (about 1,400 shards on one worker).
FROZEN_BLOCK_TIMEOUT = 6.0


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_worker_frozen_for_the_rest_of_a_long_run_costs_only_its_blocks(tmp_path):
    """Issue 28: a worker SIGSTOPped at a third of a 2,048-shard run with groups stays frozen
    for a tail several block timeouts long; its blocks are copied to the live worker (it misses
    its heartbeats, or its blocks overrun) and the run returns, same bits, while it is frozen.
    Before the fix the run failed one block timeout after the freeze ("did not return within")."""
    import functools

    from dask_research.testing.processes import dask_processes

    pipeline = functools.partial(slow_tanh, delay=0.004)
    job = mc.Job(pipeline, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=2048,
                 samples_per_shard=64, seed=28, bins=32, range=(0.0, 1.0))
    store = tmp_path / "store"
    with dask_processes(tmp_path, n_workers=2) as (client, workers):
        frozen = workers[0]
        frozen_at = next(w for w, info in workers_info(client).items() if info["name"] == "w0")
        with dask.config.set({"research.montecarlo.block-timeout": FROZEN_BLOCK_TIMEOUT}):
            t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=4, progress=False,
                                               shards_per_task=8, window=8))
            try:
                wait_for(lambda: "error" in out or _stored(store, job) >= 2048 // 3, 120, "a third of the shards")
                assert "error" not in out, out.get("error")
                frozen.send_signal(signal.SIGSTOP)
                frozen_t = time.monotonic()
                t.join(180)
                tail = time.monotonic() - frozen_t
                assert not t.is_alive(), "the run waited for the frozen worker"
                assert frozen.poll() is None   # still frozen: the run ended without it
            finally:
                frozen.send_signal(signal.SIGCONT)
        assert "error" not in out, out.get("error")
        rescues = [m for m in _events(client) if m["event"] == "rescue"]
    # The tail after the freeze was longer than the block timeout (by this process's clock):
    # the old code failed there.
    assert tail > FROZEN_BLOCK_TIMEOUT, tail
    assert rescues and all(frozen_at in m["stuck_on"] for m in rescues), rescues
    res = out["result"]
    groups = json.loads((store / "runs" / job.id / "result.json").read_text())["groups"]
    assert groups["formed"] > 0, groups
    assert sorted(mc.RunStore(str(store)).read_shards(job.id)) == list(range(2048))
    assert res.state == _reference(job).state


# -- a pipeline module the cluster cannot import -----------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("where", ["scheduler", "workers"])
def test_a_pipeline_module_the_cluster_cannot_import_fails_at_once_naming_it(tmp_path, where, monkeypatch):
    """Issue 28: a module only the client can import hung the run forever (the scheduler could not
    deserialize the graph: the block's traceback never came) or, where only the workers lacked
    it, failed after the 60 s block timeout as "a pipeline that hangs". Now one line names the
    module, who cannot import it, and the fixes, and no block timeout is reached."""
    import importlib

    from dask_research.testing.processes import dask_processes

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "only_on_the_client_28.py").write_text("import numpy as np\n\n\ndef f(a, b):\n    return np.tanh(a * b)\n")
    monkeypatch.syspath_prepend(str(mods))      # this process only: the cluster's processes lack it
    module = importlib.import_module("only_on_the_client_28")
    job = mc.Job(module.f, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=16, samples_per_shard=64,
                 seed=1, bins=16, range=(0.0, 1.0))
    with dask_processes(tmp_path, n_workers=2) as (client, _):
        if where == "workers":                  # the scheduler can import it, the workers cannot
            client.run_on_scheduler(lambda: __import__("sys").path.insert(0, str(mods)))
        t, out = in_thread(lambda: mc.run(job, client=client, verify=0, progress=False))
        t.join(150)
        assert not t.is_alive(), "the run hung on a module the cluster cannot import"
        events = _events(client)
    err = out.get("error")
    assert isinstance(err, ResearchError) and not isinstance(err, PipelineError), out
    msg = str(err)
    assert "cannot import the pipeline's module 'only_on_the_client_28'" in msg, msg
    assert ("the scheduler" in msg) == (where == "scheduler") and "the workers" in msg, msg
    assert "client.upload_file('only_on_the_client_28.py')" in msg and "FILE:job" in msg, msg
    assert "block-timeout" not in msg and not any(m["event"] == "speculate" for m in events)


# -- a pipeline that outgrows the workers' memory ----------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_pipeline_that_outgrows_the_workers_memory_says_so_naming_the_shards(tmp_path):
    """Issue 28: a pipeline that needs more memory on the workers than their limit ended in Dask's
    raw ``KilledWorker ... on N different workers``. Nanny workers (real processes) with a
    small memory limit: the error says the pipeline exceeded the workers' memory limit, which
    shards, what the pilot measured per shard, and what to change."""
    import numpy as np

    def hog(a, b):               # nested: sent by value; small in the pilot, huge on a worker
        from distributed import get_worker

        try:
            get_worker()
        except ValueError:
            return np.tanh(a * b)
        big = np.ones(2**27)     # 1 GiB, every page touched, well past the 400 MB limit
        time.sleep(30)
        return np.tanh(a * b) + big[:1].sum() * 0

    job = mc.Job(hog, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=8, samples_per_shard=256,
                 seed=3, bins=16, range=(0.0, 2.0))
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="400MB",
                         dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        t, out = in_thread(lambda: mc.run(job, client=c, verify=0, progress=False, shards_per_task=4))
        t.join(240)
        assert not t.is_alive(), "the run hung"
    err = out.get("error")
    assert isinstance(err, PipelineError), out
    msg = str(err)
    assert err.shard in ("0-3", "4-7") and "exceeded the workers' memory limit" in msg, msg
    assert "memory limit is 381.5 MiB" in msg and "the pilot measured" in msg and "per shard of 256 samples" in msg, msg
    assert "samples_per_shard" in msg and "--memory-limit" in msg, msg
