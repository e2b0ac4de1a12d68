"""The samples-per-insert limiter: bands, timeouts that say which side is stuck, and threads."""
import threading

import dask
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import InputError, RateLimitTimeout
from dask_research.replay import ExperiencePlane, RateLimiter


def test_sample_side_times_out_with_the_counts():
    rl = RateLimiter(samples_per_insert=4, tolerance=8, min_size_to_sample=10, timeout=0.05)
    rl.inserted(5)
    with pytest.raises(RateLimitTimeout, match=r"sample blocked for 0.05 s waiting for inserting: "
                                               r"5 inserted, 0 sampled, samples-per-insert target 4"):
        rl.await_sample(2)


def test_insert_side_times_out_with_the_counts():
    rl = RateLimiter(samples_per_insert=1, tolerance=2, min_size_to_sample=1, timeout=0.05)
    rl.inserted(10)
    with pytest.raises(RateLimitTimeout) as e:
        rl.await_insert(1)
    assert e.value.side == "insert" and e.value.inserts == 10 and e.value.samples == 0
    assert "insert blocked for 0.05 s waiting for sampling" in str(e.value)
    rl.sampled(9)           # diff = 10 - 9 = 1 <= max_diff 3
    rl.await_insert(1)


def test_plane_ingest_respects_the_limiter():
    rl = RateLimiter(samples_per_insert=2, tolerance=64, min_size_to_sample=32, timeout=0.05)
    plane = ExperiencePlane(CARTPOLE, capacity=1000, rate_limiter=rl, seed=0)
    assert rl.max_diff == 2 * 32 + 64
    plane.ingest(make_batch(64))             # before: diff 0 <= 128; after: 128
    plane.ingest(make_batch(1))              # before: 128 <= 128 (allowed); after: 130
    with pytest.raises(RateLimitTimeout, match="insert blocked"):
        plane.ingest(make_batch(64), timeout=0.05)
    assert plane.total == 65                 # nothing written by the refused call
    plane.sample(2)                          # plane.sample is not rate limited
    rl.sampled(2)                            # a learner reports it: diff 128, inserts allowed
    plane.ingest(make_batch(1), timeout=0.05)


def test_delivery_forwards_the_timeout_to_the_learner():
    rl = RateLimiter(samples_per_insert=1, tolerance=0, min_size_to_sample=100, timeout=0.1)
    plane = ExperiencePlane(CARTPOLE, capacity=1000, rate_limiter=rl, seed=0)
    plane.ingest(make_batch(10))
    it = plane.batches(batch_size=4, prefetch=2, timeout=0.2)
    with pytest.raises(RateLimitTimeout, match="sample blocked for 0.2 s"):
        next(it)
    assert it.closed


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_honour_the_limiters_own_timeout(prefetch):
    # The global rate-timeout is made far longer than the test's own timeout: a delivery that
    # waited for it instead of the limiter's 0.2 s would hang until pytest-timeout fails it.
    with dask.config.set({"research.replay.rate-timeout": 3600.0}):
        rl = RateLimiter(samples_per_insert=1, tolerance=0, min_size_to_sample=100, timeout=0.2)
        plane = ExperiencePlane(CARTPOLE, capacity=1000, rate_limiter=rl, seed=0)
        plane.ingest(make_batch(10))
        it = plane.batches(batch_size=4, prefetch=prefetch)
        assert it.timeout == 0.2
        with pytest.raises(RateLimitTimeout, match="sample blocked for 0.2 s"):
            next(it)
        assert plane.batches(batch_size=4, prefetch=prefetch, timeout=0.1).timeout == 0.1
        plane.close()


def test_actor_and_learner_threads_keep_the_ratio():
    spi, tol = 4.0, 512.0
    rl = RateLimiter(samples_per_insert=spi, tolerance=tol, min_size_to_sample=64, timeout=5)
    plane = ExperiencePlane(CARTPOLE, capacity=10_000, rate_limiter=rl, seed=0)
    diffs = []

    def actor():
        for i in range(40):
            plane.ingest(make_batch(32, start=32 * i))

    t = threading.Thread(target=actor)
    t.start()
    with plane.batches(batch_size=64, prefetch=1, max_batches=70) as it:
        for _ in it:
            diffs.append(rl.diff)
    t.join()
    assert rl.samples == 70 * 64
    # within the band, up to one call of overshoot on each side
    assert min(diffs) >= rl.min_diff - 64 and max(diffs) <= rl.max_diff + 32 * spi
    assert plane.stats()["rate_limiter"]["samples"] == rl.samples


def test_timeout_default_comes_from_config_at_call_time():
    with dask.config.set({"research.replay.rate-timeout": 0.25}):
        assert RateLimiter(1, 1).timeout == 0.25
    assert RateLimiter(1, 1).timeout == dask.config.get("research.replay.rate-timeout")


def test_bad_parameters():
    with pytest.raises(InputError, match="samples_per_insert=0 is invalid"):
        RateLimiter(0, 1)
    with pytest.raises(InputError, match="min_size_to_sample=0 is invalid"):
        RateLimiter(1, 1, min_size_to_sample=0)
