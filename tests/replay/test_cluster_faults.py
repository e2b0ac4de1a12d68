"""A real `dask scheduler` and `dask worker --no-nanny` processes; one worker is SIGKILLed.

Delivery goes on from the surviving shard, ``stats()`` and the event log say which shard was
lost and how much of it was unsaved, and a replacement worker gets the lost shard's last
checkpoint restored automatically.
"""
import signal
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client
from replay_helpers import CARTPOLE, make_batch, plane_events

from dask_research import replay
from dask_research._cluster import workers_info
from dask_research.replay.cluster import decode
from dask_research.testing.processes import wait_for

_wait_for = wait_for


def _worker(sfile, name):
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sfile),
         "--nthreads", "2", "--no-nanny", "--no-dashboard", "--name", name],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def real_cluster(tmp_path):
    sfile = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                               str(sfile)],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "scheduler.log", "w"))]
    try:
        _wait_for(sfile.exists, 30, "the scheduler file")
        procs += [_worker(sfile, "w0"), _worker(sfile, "w1")]
        with Client(scheduler_file=str(sfile), set_as_default=False) as client:
            client.wait_for_workers(2, timeout=30)
            yield client, sfile, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_sigkill_a_shard_worker_delivery_continues_and_a_replacement_restores(real_cluster,
                                                                               tmp_path):
    client, sfile, procs = real_cluster
    with dask.config.set({"research.replay.cluster.refresh-interval": 0.2}):
        plane = replay.ClusterPlane(CARTPOLE, client=client, capacity_per_worker=10_000,
                                    sampler=replay.PrioritizedSampler(0.6, 0.4), seed=3,
                                    checkpoint_dir=tmp_path / "ckpt")
    addr = {w["name"]: a for a, w in workers_info(client).items()}
    for name in ("w0", "w1"):
        plane.ingest(make_batch(2000), worker=addr[name])
    metas = plane.checkpoint()
    assert sorted(m["size"] for m in metas.values()) == [2000, 2000]
    plane.ingest(make_batch(500, start=2000), worker=addr["w0"])       # never checkpointed
    plane.refresh()
    victim_id = next(r.id for r in plane.shards if r.address == addr["w0"])
    survivor_id = next(r.id for r in plane.shards if r.address == addr["w1"])

    drawn_after = []
    with plane.batches(batch_size=64, prefetch=2) as it:
        first = [decode(next(it).indices)[0] for _ in range(20)]
        assert {victim_id, survivor_id} <= set(np.concatenate(first).tolist())
        procs[1].send_signal(signal.SIGKILL)                          # w0
        procs[1].wait(timeout=10)
        t0 = time.monotonic()
        _wait_for(lambda: any(r.lost for r in plane.shards), 30, "the loss to be noticed")
        for _ in range(100):                                          # delivery goes on
            drawn_after.append(decode(next(it).indices)[0])
        took = time.monotonic() - t0
        assert it.summary()["batches"] == 120
    assert took < 30
    assert set(np.concatenate(drawn_after[-50:]).tolist()) == {survivor_id}

    s = plane.stats()
    lost = s["lost_shards"]
    assert [sh["id"] for sh in lost] == [victim_id]
    assert lost[0]["lost_size"] == 2500 and lost[0]["checkpoint"]["size"] == 2000
    assert s["live_shards"] == 1 and s["size"] == 2000
    gone = plane_events(client, plane, "shard-lost")
    assert len(gone) == 1 and gone[0]["shard"] == victim_id and gone[0]["size"] == 2500
    assert gone[0]["checkpointed"] == 2000

    procs.append(_worker(sfile, "w2"))                                # a replacement
    client.wait_for_workers(2, timeout=30)
    _wait_for(lambda: (plane.refresh() or True) and plane.stats(refresh=False)["restored"], 30,
              "the lost shard to be restored")
    s = plane.stats()
    assert s["restored"] == 2000 and s["live_shards"] == 2 and s["size"] == 4000
    b = plane.sample(512)
    assert len(set(decode(b.indices)[0].tolist())) == 2
    assert plane_events(client, plane, "shard-restored")
    plane.close(drop=True)


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_every_shard_worker_sigkilled_is_reported_at_once(real_cluster, tmp_path):
    """Both shard workers die: the learner's next() names the lost shards and counts at once.

    The rate timeout is set to an hour: a learner that waited for actors instead (as it did,
    for 60 s, before saying "empty plane") would run into the test's own timeout.
    """
    client, sfile, procs = real_cluster
    with dask.config.set({"research.replay.cluster.refresh-interval": 0.2,
                          "research.replay.rate-timeout": 3600.0}):
        plane = replay.ClusterPlane(CARTPOLE, client=client, capacity_per_worker=10_000, seed=3,
                                    checkpoint_dir=tmp_path / "ckpt")
        addr = {w["name"]: a for a, w in workers_info(client).items()}
        plane.ingest(make_batch(2000), worker=addr["w0"])
        plane.ingest(make_batch(1500), worker=addr["w1"])
        plane.checkpoint()
        plane.ingest(make_batch(500, start=2000), worker=addr["w0"])
        plane.refresh()
        ids = {r.address: r.id for r in plane.shards}
        it = plane.batches(batch_size=64, prefetch=2)
        for _ in range(5):
            next(it)
        for p in procs[1:]:
            p.send_signal(signal.SIGKILL)
        for p in procs[1:]:
            p.wait(timeout=10)
        with pytest.raises(replay.ShardsLostError) as e:
            for _ in range(10**7):
                next(it)
        err = e.value
        assert sorted((s["id"], s["size"], s["checkpointed"]) for s in err.shards) == sorted(
            [(ids[addr["w0"]], 2500, 2000), (ids[addr["w1"]], 1500, 1500)])
        assert err.transitions == 4000 and err.checkpointed == 3500
        msg = str(err)
        assert msg.startswith(f"replay plane {plane.name!r}: every shard is lost: shard ")
        assert addr["w0"] in msg and addr["w1"] in msg and "\n" not in msg
        assert "4,000 transitions lost, 3,500 of them in checkpoints" in msg
        with pytest.raises(replay.ShardsLostError, match="every shard is lost"):
            plane.sample(64)
        with pytest.raises(replay.ShardsLostError, match="every shard is lost"):
            plane.ingest(make_batch(10))
        it.close()



@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_move_whose_destination_worker_died_does_not_stop_rebalancing(real_cluster):
    """A move is in flight to a SIGSTOPped worker, which is then SIGKILLed: its accept task,
    pinned to the gone worker, stays pending for ever, and every later rebalance() used to
    return 0 without planning (the full shard never gave to a new, empty one)."""
    client, sfile, procs = real_cluster
    with dask.config.set({"research.replay.cluster.refresh-interval": 0.2}):
        plane = replay.ClusterPlane({"x": ((4,), "float32")}, client=client,
                                    capacity_per_worker=1000, name="moves")
    addr = {w["name"]: a for a, w in workers_info(client).items()}
    full = {"x": np.ones((1000, 4), np.float32)}
    plane.ingest(full, worker=addr["w0"])
    plane.refresh()
    procs[2].send_signal(signal.SIGSTOP)                          # w1: the move's destination
    assert plane.rebalance(wait=False) == 500
    _wait_for(lambda: plane._move_futures[0][3].status == "finished", 30, "the eviction on w0")
    procs[2].send_signal(signal.SIGKILL)
    procs[2].send_signal(signal.SIGCONT)
    procs[2].wait(timeout=10)
    _wait_for(lambda: (plane.refresh() or True) and any(r.lost for r in plane.shards), 30,
              "the loss to be noticed")
    procs.append(_worker(sfile, "w2"))                            # a new, empty worker
    client.wait_for_workers(2, timeout=30)
    _wait_for(lambda: (plane.refresh() or True) and len(plane.shards) == 3, 30, "the new shard")
    plane.ingest(full, worker=addr["w0"])                         # w0 is full again
    plane.refresh()
    assert plane.rebalance() == 500                               # w0 gives to the new shard
    plane.refresh()
    assert sorted(r.size for r in plane.shards if not r.lost) == [500, 500]
    plane.close()


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_rebalance_gives_up_a_move_once_its_destination_worker_left(real_cluster):
    """rebalance() waits for its moves; a destination SIGKILLed mid-move (SIGSTOPped first, so
    the move cannot finish) used to keep it waiting its whole 120 s on a task pinned to the
    gone worker, which then stayed pending. Now the move is cancelled once the worker left."""
    client, sfile, procs = real_cluster
    plane = replay.ClusterPlane({"x": ((4,), "float32")}, client=client,
                                capacity_per_worker=1000, name="moves-wait")
    addr = {w["name"]: a for a, w in workers_info(client).items()}
    plane.ingest({"x": np.ones((1000, 4), np.float32)}, worker=addr["w0"])
    plane.refresh()
    submitted = []
    submit = client.submit

    def recording_submit(*args, **kwargs):
        submitted.append(submit(*args, **kwargs))
        return submitted[-1]

    procs[2].send_signal(signal.SIGSTOP)                          # w1: the move's destination

    def kill_w1():
        _wait_for(lambda: len(submitted) == 2 and submitted[0].status == "finished", 60,
                  "the eviction on w0")
        procs[2].send_signal(signal.SIGKILL)
        procs[2].send_signal(signal.SIGCONT)

    killer = threading.Thread(target=kill_w1, daemon=True)
    killer.start()
    client.submit = recording_submit
    try:
        assert plane.rebalance() == 0                             # the move failed
    finally:
        client.submit = submit
    killer.join(10)
    assert submitted[1].status == "cancelled"                     # not left pending for ever
    plane.close()


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_frozen_shard_worker_is_stalled_not_waited_for_and_comes_back_when_it_thaws(real_cluster):
    """SIGSTOP of one shard's worker stopped delivery entirely: the shard table's refresh asked
    every worker in one client.run, which waited for the frozen one until the scheduler dropped
    it (minutes). Now that shard is stalled: not sampled, delivery goes on from the other; once
    the worker thaws (SIGCONT) it answers again and is sampled again, nothing lost."""
    client, sfile, procs = real_cluster
    with dask.config.set({"research.replay.cluster.refresh-interval": 0.2}):
        plane = replay.ClusterPlane(CARTPOLE, client=client, capacity_per_worker=10_000, seed=5)
    addr = {w["name"]: a for a, w in workers_info(client).items()}
    for name in ("w0", "w1"):
        plane.ingest(make_batch(2000), worker=addr[name])
    plane.refresh()
    frozen_id = next(r.id for r in plane.shards if r.address == addr["w0"])
    other_id = next(r.id for r in plane.shards if r.address == addr["w1"])

    def thaw():
        if procs[1].poll() is None:
            procs[1].send_signal(signal.SIGCONT)

    try:
        with plane.batches(batch_size=64, prefetch=2) as it:
            try:                                  # thawed before the iterator closes, whatever fails
                assert {frozen_id, other_id} <= set(np.concatenate(
                    [decode(next(it).indices)[0] for _ in range(10)]).tolist())
                procs[1].send_signal(signal.SIGSTOP)                       # w0
                got: list = []
                taker = threading.Thread(target=lambda: got.extend(next(it) for _ in range(40)),
                                         daemon=True)
                taker.start()
                taker.join(120)                   # bounded: the old code delivers nothing for minutes
                assert len(got) == 40, f"{len(got)} of 40 batches while w0 was frozen"
                stalled = next(r for r in plane.shards if r.id == frozen_id)
                assert stalled.stalled and not stalled.lost
                assert [s["id"] for s in plane.stats(refresh=False)["stalled_shards"]] == [frozen_id]
                assert set(np.concatenate([decode(b.indices)[0] for b in got[-10:]]).tolist()) == {other_id}
                thaw()
                _wait_for(lambda: not next(r for r in plane.shards if r.id == frozen_id).stalled, 60,
                          "the thawed shard to answer again")
                seen: set = set()
                _wait_for(lambda: seen.update(decode(next(it).indices)[0].tolist()) or frozen_id in seen,
                          60, "a batch from the thawed shard")
            finally:
                thaw()
        assert not any(r.lost for r in plane.shards)
        assert plane.stats()["size"] == 4000
    finally:
        thaw()
        plane.close()
