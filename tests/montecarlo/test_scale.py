"""Issue 20: block tasks write their own shard files when the workers can reach the store.

Real ``dask scheduler`` / ``dask worker`` processes where it matters: the client's own
``RunStore.write_shards`` is made to fail, so a run only succeeds if the workers wrote the store.
"""
import json
import pathlib
import uuid

import dask
import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research.montecarlo.address import canonical_json
from dask_research.montecarlo.blocks import compute_and_store_block
from dask_research.montecarlo.store import RunStore, StoreTarget
from dask_research.montecarlo.tree import tree_fold
from dask_research.testing.pipelines import slow_tanh  # importable by `dask worker` processes
from dask_research.testing.processes import dask_processes


def _job(shards=32, seed=11):
    return mc.Job(slow_tanh, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=shards,
                  samples_per_shard=512, seed=seed, bins=32, range=(0.0, 1.0))


@pytest.fixture
def process_cluster(tmp_path):
    """A `dask scheduler` and two `dask worker` processes on this host (the environment passed on)."""
    with dask_processes(tmp_path, 2, nanny=True) as (client, _):
        yield client


def _reference(job):
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        return mc.run(job, client=c, verify=0, progress=False, shards_per_task=1)


def _stored_states(store, job) -> dict:
    return {s: canonical_json(mc.RunStore(str(store)).read_shards(job.id, decoder=lambda d: d)[s][0])
            for s in range(job.shards)}


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_process_workers_write_the_store_and_the_client_writes_no_shard(process_cluster, tmp_path, monkeypatch):
    job = _job()
    expected = _reference(job)
    client_writes = []

    def refuse(self, *a, **k):        # the client process only: the workers are other processes
        client_writes.append(a[0] if a else None)
        raise AssertionError("the client wrote a shard file")

    monkeypatch.setattr(RunStore, "write_shards", refuse)
    store = tmp_path / "store"
    res = mc.run(job, client=process_cluster, store=str(store), verify=3, shards_per_task=4, progress=False)
    monkeypatch.undo()
    assert client_writes == []
    assert res.state == expected.state                       # the same bits as one shard per task, in-process
    rec = json.loads((store / "runs" / job.id / "result.json").read_text())["store_writes"]
    assert rec["mode"] == "workers" and rec["blocks_by_workers"] == 8 and rec["blocks_by_client"] == 0
    held = mc.RunStore(str(store)).read_shards(job.id)
    assert sorted(held) == list(range(job.shards))
    assert {w for _, w, _ in held.values()} <= set(process_cluster.scheduler_info()["workers"])
    v = res.verification
    assert v["mismatches"] == [] and all(c["match"] for c in v["checked"]) and v["checks_elsewhere"] >= 3
    # The files hold exactly what the client-writing path stores.
    with dask.config.set({"research.montecarlo.store-writes": "client"}):
        other = tmp_path / "client-store"
        again = mc.run(job, client=process_cluster, store=str(other), verify=0, shards_per_task=8, progress=False)
    assert again.state == res.state
    assert _stored_states(other, job) == _stored_states(store, job)
    rec = json.loads((other / "runs" / job.id / "result.json").read_text())["store_writes"]
    assert rec["mode"] == "client" and "store-writes is client" in rec["client_reason"]
    # Resume from worker-written files: only what is missing is computed, the bits are unchanged.
    files = sorted((store / "runs" / job.id / "shards").glob("*.json"))
    for f in files[:2]:
        f.unlink()
    resumed = mc.run(job, client=process_cluster, store=str(store), verify=0, shards_per_task=4, progress=False)
    assert resumed.computed_shards == 8 and resumed.reused_shards == 24 and resumed.state == expected.state


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_a_store_the_workers_cannot_reach_is_written_by_the_client_and_said_so(process_cluster):
    # An in-memory store lives in the client's process: the worker processes cannot see it.
    job = _job(shards=16, seed=12)
    url = f"memory://scale-{uuid.uuid4().hex[:8]}"
    res = mc.run(job, client=process_cluster, store=url, verify=2, shards_per_task=4, progress=False)
    assert res.state == _reference(job).state
    rs = mc.RunStore(url)
    assert sorted(rs.read_shards(job.id)) == list(range(16))
    rec = rs.read_result(job.id)["store_writes"]
    assert rec["mode"] == "client" and rec["blocks_by_client"] == 4 and rec["blocks_by_workers"] == 0
    assert "is not visible from worker" in rec["client_reason"] and "lease.json" in rec["client_reason"]


def test_a_block_writes_only_under_the_runs_lease_and_returns_what_verification_keeps(tmp_path):
    job = _job(shards=16, seed=13)
    reducer = job.make_reducer((0.0, 1.0))
    rs = RunStore(str(tmp_path / "s")).prepare()
    shards = rs.run_dir(job.id) + "/shards"
    with rs.lease(job.id) as lease:
        foreign = StoreTarget.of(rs, job.id, "not-this-runs-token")
        got = compute_and_store_block(job, reducer, 4, 8, {}, foreign, keep=(6,))
        assert got.stored is None and "does not hold this run's lease" in got.store_note
        assert sorted(got.shard_states) == [4, 5, 6, 7] and not pathlib.Path(shards).exists()
        mine = StoreTarget.of(rs, job.id, lease.token)
        got = compute_and_store_block(job, reducer, 4, 8, {5: mc.compute_shard(job, 5, reducer=reducer)}, mine,
                                      keep=(6,))
        assert got.store_note is None and got.computed == [4, 6, 7]
        assert sorted(got.shard_states) == [4, 6]            # the first computed shard and the kept one
        doc = json.loads(pathlib.Path(got.stored).read_text())
        assert got.checksum == doc["checksum"] and sorted(doc["states"]) == ["4", "6", "7"]
        held = rs.read_shards(job.id)
        assert all(held[s][0] == mc.compute_shard(job, s, reducer=reducer) for s in (4, 6, 7))
        assert got.state == tree_fold(reducer.merge, [mc.compute_shard(job, s, reducer=reducer) for s in range(4, 8)])


def test_without_a_store_a_block_returns_its_root_and_only_the_states_verification_keeps():
    job = _job(shards=16, seed=15)
    reducer = job.make_reducer((0.0, 1.0))
    got = compute_and_store_block(job, reducer, 8, 16, {}, None, keep=(11, 13), trim=True)
    assert sorted(got.shard_states) == [8, 11, 13] and got.computed == list(range(8, 16)) and got.stored is None
    assert got.state == tree_fold(reducer.merge, [mc.compute_shard(job, s, reducer=reducer) for s in range(8, 16)])
    assert got.shard_states[11] == mc.compute_shard(job, 11, reducer=reducer)


def test_store_writes_must_be_auto_or_client(tmp_path):
    from dask_research.exceptions import ConfigError

    job = _job(shards=4, seed=14)
    with dask.config.set({"research.montecarlo.store-writes": "sometimes"}):
        with pytest.raises(ConfigError, match="store-writes"):
            mc.run(job, store=str(tmp_path / "s"), progress=False, verify=0)


def test_a_large_cluster_gets_longer_tasks_so_the_client_is_not_its_ceiling():
    from dask_research.montecarlo.run import plan_blocks
    from dask_research.montecarlo.run_settings import RunSettings
    from dask_research.montecarlo.tree import choose_block

    # The seed's shard (7.5 ms): 0.3 s tasks are 32 shards, whatever the cluster, without the rule.
    assert choose_block(10**7, 0.0075, threads=1000, target_seconds=0.3, max_block=4096) == 32
    # 1,000 threads finish 1000 / task-time blocks a second; at 2 ms of client CPU per block
    # tasks of >= 4 s keep the client at most half busy.
    b = choose_block(10**7, 0.0075, threads=1000, target_seconds=0.3, max_block=4096, client_block_seconds=0.002)
    assert b == 512 and 1000 / (b * 0.0075) * 0.002 <= 0.55
    # A small cluster is sized as before; the cap and the balance rule still hold.
    assert choose_block(640, 0.0106, threads=2, target_seconds=0.3, max_block=4096, client_block_seconds=0.002) == 32
    assert choose_block(10**7, 0.0075, threads=1000, target_seconds=0.3, max_block=256, client_block_seconds=0.002) == 256
    assert choose_block(20_000, 0.0075, threads=1000, target_seconds=0.3, max_block=4096, client_block_seconds=0.002) == 4
    job = _job(shards=10**6, seed=16)
    with dask.config.set({"research.montecarlo.max-shards-per-task": 4096}):
        with dask.config.set({"research.montecarlo.client-block-seconds": 0}):
            assert plan_blocks(job, 0.0075, threads=1000) == 32     # off: task-seconds alone
        with dask.config.set({"research.montecarlo.client-block-seconds": 0.002}):
            assert plan_blocks(job, 0.0075, threads=1000) == 128    # 10**6 / (1000 x 4) caps it at 250 -> 128
    # The defaults: a laptop's tasks are sized as before; 2,000 threads get 7.7 s tasks at the seed's
    # shard, so neither the client (~1 ms per block) nor the scheduler (~1-1.5 ms per task) is the ceiling.
    big = _job(shards=10**7, seed=17)
    assert [plan_blocks(big, 0.0075, threads=t) for t in (2, 100, 200, 500, 1000, 2000, 4000)] == \
        [32, 32, 64, 256, 512, 1024, 512]           # 4,000 threads: 4 tasks each of 10**7 shards bounds it
    from dask_research.exceptions import ConfigError

    with dask.config.set({"research.montecarlo.client-block-seconds": "fast"}):
        with pytest.raises(ConfigError, match="client-block-seconds"):
            plan_blocks(job, 0.0075, threads=8)
    assert plan_blocks(job, 0.0075, threads=8, settings=RunSettings.parse(shards_per_task=64)) == 64


@pytest.mark.timeout(180, method="thread")
def test_a_task_size_whose_bookkeeping_cannot_fit_the_client_is_refused_before_any_block(tmp_path):
    """Issue 28: shards_per_task=1 on a 10^7-shard job held 1.9 GB on the client after 60 s (every
    block's bounds, place in the queue and folded state) and took ~75 s before its first block.
    Now it is refused in one line, before the blocks are built: the client's memory stays small,
    and the store holds nothing of the run (no manifest, no lease file)."""
    import tracemalloc

    from dask_research.exceptions import InputError
    from dask_research.testing.threads import in_thread

    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=10**7, samples_per_shard=64, seed=1,
                 range=(-8.0, 8.0))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        tracemalloc.start()
        try:
            t, out = in_thread(lambda: mc.run(job, client=c, verify=0, progress=False, shards_per_task=1,
                                              store=tmp_path))
            t.join(120)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert not t.is_alive(), "the run went on building its bookkeeping"
    err = out.get("error")
    assert isinstance(err, InputError) and err.name == "shards_per_task" and err.value == 1, out
    assert "10,000,000 tasks" in str(err) and "use shards_per_task=" in str(err), str(err)
    assert peak < 200 * 2**20, peak          # the old code's bookkeeping passed 1 GB
    assert not list(tmp_path.rglob(job.id)), sorted(map(str, tmp_path.rglob("*")))


@pytest.mark.timeout(180, method="thread")
def test_a_pilot_chosen_task_size_that_cannot_fit_says_the_pilot_chose_it():
    """A 2^40-shard job left to the pilot: the pilot's task size (bounded by
    max-shards-per-task) cannot keep the bookkeeping on the client, and the one line says that
    the pilot chose it and what to pass instead, not "leave it to the pilot", which it was."""
    from dask_research.exceptions import InputError
    from dask_research.testing.threads import in_thread

    job = mc.Job(lambda a: a, {"a": mc.Normal(0.0, 1.0)}, shards=2**40, samples_per_shard=64, seed=1,
                 range=(-8.0, 8.0))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        t, out = in_thread(lambda: mc.run(job, client=c, verify=0, progress=False))
        t.join(120)
        assert not t.is_alive(), "the run went on building its bookkeeping"
    err = out.get("error")
    assert isinstance(err, InputError) and err.name == "shards_per_task", out
    msg = str(err)
    assert "the pilot chose" in msg and "leave it to the pilot" not in msg, msg
    fits = int(msg.split("pass shards_per_task=")[1].split()[0])
    assert fits > err.value                                  # a larger task size, named
