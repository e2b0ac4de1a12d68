"""Cluster-plane pieces without a cluster: indices, placement policy, prefetch rule, shards."""
import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research import replay
from dask_research.exceptions import InputError
from dask_research.replay.cluster import (
    ShardMissingError,
    WorkerShard,
    decode,
    encode,
    local_shard,
    plan_moves,
    prefetch_depth,
)
from dask_research.replay.cluster.cluster_delivery import request_group
from dask_research.replay.cluster.plugin import ShardPlugin
from dask_research.replay.cluster.table import assemble


def test_indices_round_trip_and_refuse_bad_shard_ids():
    keys = np.array([0, 5, 2**47 - 1, 2**40])
    for sid in (0, 1, 77, 32767):
        s, k = decode(encode(sid, keys))
        assert (s == sid).all() and (k == keys).all()
    with pytest.raises(InputError, match="shard_id"):
        encode(32768, keys)


def test_plan_moves_full_to_empty_only():
    assert plan_moves({"a": (1000, 1000), "b": (0, 1000)}, max_move=10_000) == [("a", "b", 500)]
    assert plan_moves({"a": (1000, 1000), "b": (600, 1000)}) == []          # b not empty enough
    assert plan_moves({"a": (940, 1000), "b": (0, 1000)}) == []             # a not full
    moves = plan_moves({"a": (100, 100), "b": (0, 100), "c": (10, 100)}, max_move=80)
    assert moves == [("a", "b", 50)]                                         # half of a at most
    with pytest.raises(InputError):
        plan_moves({"a": (1, 1)}, high=0.4, low=0.5)


def test_prefetch_rule_grows_with_latency_and_shrinks_with_step():
    kw = dict(bytes_per_batch=1e5, bandwidth=1e8, max_in_flight=64, max_bytes=64e6)
    fast = prefetch_depth(rtt=0.01, step=0.001, **kw)
    slow = prefetch_depth(rtt=0.01, step=0.02, **kw)
    assert fast > slow >= 1
    assert prefetch_depth(rtt=0.01, step=0.001, bytes_per_batch=1e5, bandwidth=1e5,
                          max_in_flight=64, max_bytes=64e6) == 64           # slow link: more
    assert prefetch_depth(0.01, 32e6, 1e9, 1e-4, 64, 64e6) == 2             # memory cap
    assert request_group(0.01, 0.001, 32) == 13 and request_group(0.001, 0.01, 32) == 1


def test_worker_shard_sample_update_and_stale_uid():
    sh = WorkerShard("t", CARTPOLE, 100, replay.PrioritizedSampler(1.0, 1.0, eps=0.0), seed=0)
    sh.ingest(make_batch(60))
    out = sh.sample(16)
    assert out["records"].shape == (16,) and (out["leaf"] == 1.0).all()
    assert (out["records"]["action"] == out["keys"]).all()     # action field is the key
    assert sh.update("someone-else", out["keys"], np.full(16, 5.0)) == 0
    assert sh.update(sh.uid, out["keys"], np.full(16, 5.0)) == 16
    assert np.allclose(sh.priorities(out["keys"]), 5.0)
    sh.ingest(make_batch(100, start=60))                       # overwrites every old key
    assert sh.update(sh.uid, out["keys"], np.full(16, 7.0)) == 0
    assert np.isnan(sh.priorities(out["keys"])).all()
    sh.close()


def test_evict_oldest_and_accept_keep_priorities():
    a = WorkerShard("t", CARTPOLE, 100, replay.PrioritizedSampler(0.5, 1.0, eps=0.0), seed=0)
    b = WorkerShard("t", CARTPOLE, 100, replay.PrioritizedSampler(0.5, 1.0, eps=0.0), seed=1)
    a.ingest(make_batch(100))
    a.update(a.uid, np.arange(10), np.full(10, 9.0))
    moved = a.evict_oldest(30)
    assert moved["n"] == 30 and len(a.plane) == 70
    assert moved["fields"]["action"].tolist() == list(range(30))
    assert np.allclose(moved["priorities"][:10], 9.0) and np.allclose(moved["priorities"][10:], 1.0)
    assert b.accept(moved) == 30
    assert np.allclose(b.priorities(np.arange(10)) ** 2, 9.0)   # leaf = p ** alpha
    keys = a.sample(500)["keys"]
    assert keys.min() >= 30                                      # evicted keys are never drawn
    a.close(), b.close()


def test_checkpoint_restore_of_a_shard(tmp_path):
    a = WorkerShard("t", CARTPOLE, 100, replay.PrioritizedSampler(0.6, 0.4), seed=0)
    a.ingest(make_batch(80))
    a.update(a.uid, np.arange(5), np.full(5, 3.0))
    meta = a.checkpoint(tmp_path)
    b = WorkerShard("t", CARTPOLE, 100, replay.PrioritizedSampler(0.6, 0.4), seed=1)
    assert b.restore(meta["path"]) == 80
    assert np.allclose(b.priorities(np.arange(80)), a.priorities(np.arange(80)))
    with pytest.raises(InputError, match="empty shard"):
        b.restore(meta["path"])
    a.close(), b.close()


def test_assemble_weights_across_shards():
    spec = replay.ExperienceSpec(CARTPOLE)
    rec = spec.empty(2)
    parts = [(0, {"records": rec, "keys": np.array([1, 2]), "leaf": np.array([1.0, 4.0])}),
             (1, {"records": rec, "keys": np.array([3, 4]), "leaf": np.array([2.0, 0.5])})]
    b = assemble(spec, parts, beta=1.0, min_leaf=0.5)
    assert np.allclose(b.weights, [0.5, 0.125, 0.25, 1.0])
    assert decode(b.indices)[0].tolist() == [0, 0, 1, 1]


def test_plugin_sizes_from_memory_and_explains_a_missing_shard():
    p = ShardPlugin("m", CARTPOLE, memory_fraction=0.5)

    class W:
        address = "tcp://x:1"

        class memory_manager:
            memory_limit = 45 * 1000 * 2          # 45-byte records... aligned to the itemsize

        plugins: dict = {}

    cap, tiers = p.shard_layout(W)
    assert tiers is None and cap == (45 * 1000) // p.spec.itemsize
    assert ShardPlugin("m", CARTPOLE, capacity_per_worker=7).shard_layout(W) == (7, None)
    with pytest.raises(ShardMissingError, match="holds no shard of plane 'm'"):
        local_shard("m", W)
    with pytest.raises(InputError):
        ShardPlugin("m", CARTPOLE, capacity_per_worker=0)


def test_a_cluster_plane_without_any_client_says_so_in_one_line():
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()          # none in this process: the plane has nothing to attach to
    with pytest.raises(InputError) as err:
        replay.ClusterPlane(CARTPOLE)
    msg = str(err.value)
    assert msg.startswith("ClusterPlane: client=None is invalid") and "client=Client(" in msg and "\n" not in msg
