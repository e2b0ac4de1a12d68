"""The fast sampling paths: UniformSampler.draw, and batches made in the learner's thread.

No timings are asserted: the tests check that the fast paths give exactly what the general
ones give, and which thread made each batch.
"""
import threading
import time

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.replay import ExperiencePlane, RecentSampler, Sampler, UniformSampler
from dask_research.replay.samplers.base import Sampler as BaseSampler
from dask_research.replay.samplers.uniform import uniform_ranks


@pytest.mark.parametrize("total,size", [(7, 7), (10, 10), (23, 10), (40, 10), (9, 6), (23, 4)])
def test_uniform_draw_matches_the_generic_draw(total, size):
    """Uniform draw: the generator's integer j is the age rank, key = oldest key + j, slot =
    key % capacity; for a fresh, a full, a wrapped ring, and one restored with fewer
    transitions than were inserted. Where the ring is not full this is exactly what
    sample() + key arithmetic gives."""
    s = UniformSampler()
    s.attach(10)
    slots, keys, w = s.draw(total, size, 500, np.random.default_rng(3))
    j = uniform_ranks(np.random.default_rng(3), size, 500)
    np.testing.assert_array_equal(keys, total - size + j)
    np.testing.assert_array_equal(slots, keys % 10)
    assert w is None
    if size < 10:
        slow = BaseSampler.draw(s, total, size, 500, np.random.default_rng(3))
        np.testing.assert_array_equal(slow[0], slots)
        np.testing.assert_array_equal(slow[1], keys)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 2 ** 20, 2 ** 20 + 1, 10 ** 6, 2 ** 40 - 1, 2 ** 52 + 1])
def test_uniform_ranks_stay_in_range(size):
    class Top:                                # the largest float random() can return
        def random(self, n):
            return np.full(n, np.nextafter(1.0, 0.0))

    assert uniform_ranks(Top(), size, 4).tolist() == [size - 1] * 4
    j = uniform_ranks(np.random.default_rng(0), size, 10_000)
    assert j.dtype == np.int64 and j.min() >= 0 and j.max() < size


def test_plane_batches_carry_their_keys_after_wrapping():
    plane = ExperiencePlane(CARTPOLE, capacity=1000, seed=0)
    try:
        for i in range(5):                       # 2500 inserted, 1000 kept, cursor at 500
            plane.ingest(make_batch(500, start=500 * i))
        b = plane.sample(4096)
        np.testing.assert_array_equal(b.action, b.indices)
        assert b.indices.min() >= 1500 and b.indices.max() < 2500
    finally:
        plane.close()


def test_a_subclass_that_overrides_sample_is_honoured():
    class Even(UniformSampler):
        def sample(self, cursor, size, batch_size, rng):
            j, w = super().sample(cursor, size, batch_size, rng)
            return j - j % 2, w

    plane = ExperiencePlane(CARTPOLE, capacity=100, sampler=Even(), seed=0)
    try:
        plane.ingest(make_batch(100))
        assert (plane.sample(256).indices % 2 == 0).all()
    finally:
        plane.close()


def _sequence(plane_seed, prefetch, step_s, n=120, **kw):
    plane = ExperiencePlane(CARTPOLE, capacity=2000, seed=plane_seed, **kw)
    plane.ingest(make_batch(2000))
    makers = []
    orig = plane.draw

    def draw(*a, **k):
        makers.append(threading.get_ident())
        return orig(*a, **k)

    plane.draw = draw
    out = []
    try:
        with plane.batches(batch_size=32, prefetch=prefetch, max_batches=n) as it:
            for b in it:
                out.append(b.indices.copy())
                np.testing.assert_array_equal(b.action, b.indices)
                if step_s:
                    time.sleep(step_s)
    finally:
        plane.close()
    return out, makers


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("step_s", [0.0, 0.002])
def test_prefetched_batches_are_the_seeded_sequence_whichever_thread_made_them(step_s):
    """Batch k is the k-th draw of the plane's generator with or without prefetching, whether
    the delivery thread or the learner made it (learner without work, and with a 2 ms step)."""
    ref, _ = _sequence(5, 0, 0.0)
    got, _ = _sequence(5, 2, step_s)
    assert len(got) == len(ref) == 120
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(120, method="thread")
def test_a_learner_without_work_is_served_in_its_own_thread():
    """With prefetch=2 and no learner work, the learner makes the batches itself instead of
    waiting for a thread hand-over (the old pipeline made every batch in the delivery thread)."""
    me = threading.get_ident()
    _, makers = _sequence(1, 2, 0.0, n=400)
    assert sum(m == me for m in makers) >= 0.5 * len(makers)


@pytest.mark.timeout(120, method="thread")
def test_a_learner_with_a_long_step_gets_prefetched_batches():
    """A learner whose step (sleep: GIL-free, like a GPU step) is long gets its batches from
    the delivery thread, prepared during the step."""
    me = threading.get_ident()
    _, makers = _sequence(1, 2, 0.003, n=60)
    assert sum(m != me for m in makers) >= 0.5 * len(makers)


def test_recent_sampler_draw_keys_match_slots():
    s = RecentSampler(window=5)
    assert isinstance(s, Sampler)
    s.attach(10)
    slots, keys, _ = s.draw(23, 10, 200, np.random.default_rng(0))
    assert ((keys >= 18) & (keys < 23)).all()
    np.testing.assert_array_equal(slots, keys % 10)


@pytest.mark.timeout(120, method="thread")
def test_max_batches_are_all_delivered_whichever_thread_made_the_last():
    """The learner must not stop while the delivery thread still makes the last batch (the
    learner found the queue empty, every batch drawn, one still in flight)."""
    plane = ExperiencePlane({"x": ((2,), "float32")}, capacity=100, seed=0)
    try:
        plane.ingest({"x": np.ones((50, 2))})
        for _ in range(300):
            with plane.batches(batch_size=4, prefetch=2, max_batches=3) as it:
                assert len(list(it)) == 3
    finally:
        plane.close()
