"""What the plane, snapshots and cluster shards read of samplers, and the objects the plane is
built from (draw, counters, migrator, tier figures)."""
import threading

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CheckpointError
from dask_research.replay import (
    BatchIterator,
    EmptyPlaneError,
    ExperiencePlane,
    HostStorage,
    PrioritizedSampler,
    RecentSampler,
    UniformSampler,
    snapshot,
)
from dask_research.replay.cluster.worker_shard import WorkerShard
from dask_research.replay.migrator import Migrator
from dask_research.replay.samplers import BUILTIN
from dask_research.replay.source import BatchSource, Draw
from dask_research.replay.stats import PlaneCounters

SAMPLERS = [UniformSampler(), PrioritizedSampler(0.6, 0.4, eps=0.01, shuffle=False),
            RecentSampler(window=7)]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
def test_from_state_rebuilds_the_parameters(sampler):
    sampler.attach(8)
    state = {k: v for k, v in sampler.state_dict().items() if not isinstance(v, np.ndarray)}
    again = type(sampler).from_state(state)
    assert repr(again) == repr(sampler) and BUILTIN[type(sampler).__name__] is type(sampler)
    assert snapshot.sampler_for({"sampler": {"class": type(sampler).__name__, "state": state}}).__class__ \
        is type(sampler)


def test_sampler_for_refuses_a_class_that_is_not_built_in():
    with pytest.raises(CheckpointError, match="sampler 'Mine' is not built in"):
        snapshot.sampler_for({"sampler": {"class": "Mine", "state": {}}}, "ck")


def test_prioritized_leaves_mass_and_priorities_round_trip():
    s = PrioritizedSampler(alpha=0.5, beta=1.0, eps=0.1)
    s.attach(8)
    s.on_insert(0, 6)
    slots = np.arange(6)
    pr = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 9.0])
    s.update(slots, pr)
    np.testing.assert_allclose(s.leaves(slots), (pr + 0.1) ** 0.5)
    assert s.mass(6) == pytest.approx(((pr + 0.1) ** 0.5).sum()) and s.mass(0) == 0.0
    assert s.min_leaf() == pytest.approx(0.1 ** 0.5)
    np.testing.assert_allclose(s.priorities(slots), pr, atol=1e-12)   # the transform undone
    s.clear(slots[:2])
    assert s.leaves(slots[:2]).tolist() == [0.0, 0.0]
    s.reset()
    assert s.mass(6) == 0.0
    s.load_leaves(slots, np.array([0.0, 1, 2, 3, 4, 5]))
    assert s.mass(6) == 15.0 and s.min_leaf() == 1.0      # a zero leaf is not the minimum
    s.resume({"max_priority": 7.0})
    assert s.max_priority == 7.0
    flat = PrioritizedSampler(alpha=0.0, beta=1.0)
    flat.attach(2)
    assert flat.priorities(np.arange(2)) is None           # alpha 0: leaves say nothing


@pytest.mark.parametrize("sampler,mass", [(UniformSampler(), 9.0), (RecentSampler(4), 4.0)])
def test_samplers_without_priorities(sampler, mass):
    sampler.attach(10)
    slots = np.arange(3)
    assert sampler.leaves(slots) is None and sampler.priorities(slots) is None
    assert sampler.mass(9) == mass and np.isnan(sampler.min_leaf())
    sampler.clear(slots), sampler.reset(), sampler.load_leaves(slots, np.ones(3))
    sampler.resume({"max_priority": 3.0})


def test_draw_is_the_one_sampling_path_and_the_shard_uses_it():
    kw = dict(capacity=100, sampler=PrioritizedSampler(0.6, 0.4))
    plane = ExperiencePlane(CARTPOLE, seed=3, **kw)
    shard = WorkerShard("p", CARTPOLE, seed=3, **kw)
    try:
        with pytest.raises(EmptyPlaneError):
            plane.draw(4)
        for p in (plane, shard):                 # the ring wraps
            p.ingest(make_batch(100))
            p.ingest(make_batch(50, start=100))
        assert isinstance(plane, BatchSource)
        times: dict = {}
        d = plane.draw(16, times=times, leaves=True)
        assert isinstance(d, Draw) and set(times) == {"sample", "gather"}
        np.testing.assert_array_equal(d.records["action"], d.keys)
        np.testing.assert_array_equal(d.leaves, plane.sampler.leaves(d.keys % 100))
        out = shard.sample(16)                  # the same seed: the same draw
        np.testing.assert_array_equal(out["keys"], d.keys)
        np.testing.assert_array_equal(out["leaf"], d.leaves)
        np.testing.assert_array_equal(out["records"], d.records)
        assert shard.plane.stats()["sampled"] == 16 and plane.stats()["sampled"] == 16
        assert shard.mass() == pytest.approx(plane.sampler.mass(100))
    finally:
        plane.close()
        shard.close()


def test_evict_oldest_hands_back_the_priorities_it_was_given():
    a = WorkerShard("p", CARTPOLE, 50, PrioritizedSampler(0.6, 0.4, eps=0.0), seed=0)
    b = WorkerShard("p", CARTPOLE, 50, PrioritizedSampler(0.6, 0.4, eps=0.0), seed=0)
    try:
        pr = np.linspace(0.5, 3.0, 30)
        a.ingest(make_batch(30), priorities=pr)
        moved = a.evict_oldest(10)
        np.testing.assert_allclose(moved["priorities"], pr[:10], rtol=1e-9)
        assert len(a.plane) == 20 and np.isnan(a.priorities(np.arange(10))).all()
        assert b.accept(moved) == 10
        np.testing.assert_allclose(b.priorities(np.arange(10)), (pr[:10]) ** 0.6, rtol=1e-9)
    finally:
        a.close()
        b.close()


def test_batch_iterator_needs_only_a_source():
    """Delivery draws through the BatchSource protocol: a wrapper exposing just that works."""
    plane = ExperiencePlane(CARTPOLE, capacity=100, seed=0)
    plane.ingest(make_batch(100))

    class Source:
        spec, rate_limiter, lock = plane.spec, None, threading.RLock()
        draw, gather_keys = plane.draw, plane.gather_keys

    try:
        with BatchIterator(Source(), batch_size=8, prefetch=1, max_batches=3) as it:
            got = [b.indices.copy() for b in it]
        assert len(got) == 3 and it.stats.summary()["batches"] == 3
    finally:
        plane.close()


def test_counters_and_tier_figures():
    c = PlaneCounters()
    assert np.isnan(c.figures(0)["ingest_rate"])
    c.ingested(0.0)
    c.sampled(4, 0.0)
    f = c.figures(inserted=10)
    assert (f["ingest_calls"], f["sample_calls"], f["sampled"]) == (1, 1, 4)
    assert f["ingest_busy_rate"] > 0 and np.isnan(f["sample_busy_rate"])
    host = HostStorage(ExperiencePlane(CARTPOLE, capacity=4).spec, 4)
    t = host.tier_stats(3)
    assert t[0]["used"] == 3 and t[0]["bytes_used"] == 3 * host.spec.itemsize and host.moves == 0


def test_migrator_rounds_follow_pokes_and_stop_on_close():
    rounds, left = [], [2]

    def rebalance(n):
        m.clear()
        rounds.append(n)
        left[0] -= 1
        return 1

    m = Migrator(rebalance, lambda: left[0] > 0, interval=0.001, batch=5)
    m.poke()                                   # no thread without start
    assert m._thread is None
    m.poke(start=True)
    for _ in range(5000):
        if len(rounds) >= 2:
            break
        threading.Event().wait(0.001)
    m.close()
    assert rounds[:2] == [5, 5] and not m._thread.is_alive()
    m.poke(start=True)                         # closed: stays stopped
