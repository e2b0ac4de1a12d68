"""Delivery: prefetch to numpy and torch, exposed latency and stage times, transforms, close."""
import threading
import time

import dask
import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import InputError
from dask_research.replay import EmptyPlaneError, ExperiencePlane, Normalize, NStepReturn, PrioritizedSampler


@pytest.fixture
def plane():
    p = ExperiencePlane(CARTPOLE, capacity=5000, seed=0,
                        sampler=PrioritizedSampler(alpha=0.6, beta=0.4))
    p.ingest(make_batch(3000))
    yield p
    p.close()


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_numpy_batches(plane, prefetch):
    with plane.batches(batch_size=64, prefetch=prefetch, max_batches=20) as it:
        got = list(it)
    assert len(got) == 20
    for b in got:
        assert b.obs.shape == (64, 4) and b.obs.dtype == np.float32
        np.testing.assert_array_equal(b.action, b.indices)        # data belongs to its key
        assert b.weights.shape == (64,) and b.weights.max() <= 1.0
        assert set(b.info) >= {"sample", "gather", "transform", "copy"}
    # batches are fresh memory: an earlier batch is not overwritten by later ones
    first = got[0]
    np.testing.assert_array_equal(first.action, first.indices)


def test_torch_batches_are_zero_copy_views(plane):
    torch = pytest.importorskip("torch")
    with plane.batches(batch_size=32, prefetch=2, to="torch", max_batches=5) as it:
        for b in it:
            assert isinstance(b.obs, torch.Tensor) and b.obs.dtype == torch.float32
            assert b.done.dtype == torch.bool and b.action.dtype == torch.int64
            assert isinstance(b.weights, torch.Tensor)
            np.testing.assert_array_equal(b.action.numpy(), b.indices)
            # obs and next_obs are views of one record buffer, at their offsets in the record
            off = plane.spec.record_dtype.fields["next_obs"][1]
            assert b.next_obs.data_ptr() - b.obs.data_ptr() == off
            assert b.obs.stride() == (plane.spec.itemsize // 4, 1)
            plane.update_priorities(torch.from_numpy(b.indices), b.reward.abs() + 0.1)


def test_exposed_latency_is_recorded_and_prefetch_hides_it(plane):
    """A learner whose step (a GIL-free sleep) is longer than producing a batch: with prefetch
    it barely waits; without, it waits the whole production time every step."""
    def run(prefetch):
        with plane.batches(batch_size=256, prefetch=prefetch, max_batches=40) as it:
            for _ in it:
                time.sleep(0.004)
        return plane.stats()["delivery"]

    d0, d2 = run(0), run(2)
    for d in (d0, d2):
        assert d["batches"] == 40
        assert d["exposed_mean_s"] > 0 and d["step_mean_s"] >= 0.004
        assert all(v >= 0 for v in d["stages_mean_s"].values())
        assert d["exposed_p99_s"] >= d["exposed_p50_s"]
    produce = sum(d0["stages_mean_s"][k] for k in ("sample", "gather", "transform", "copy"))
    assert d0["exposed_mean_s"] >= produce * 0.9        # no prefetch: every stage is exposed
    # the trace, not a race of two timings on a shared machine: without prefetch no batch was
    # ever waiting for the learner; with it, most of the steady-state batches were
    assert d0["ready"] == 0
    assert d2["ready"] >= (d2["batches"] - 1) // 2, d2


def test_prefetch_reads_config_at_call_time(plane):
    with dask.config.set({"research.replay.prefetch": 0, "research.replay.batch-size": 7}):
        it = plane.batches(max_batches=1)
    assert it.prefetch == 0 and it.batch_size == 7 and next(it).size == 7
    it.close()


def test_errors_reach_the_learner():
    empty = ExperiencePlane(CARTPOLE, capacity=10)
    with pytest.raises(EmptyPlaneError):
        next(empty.batches(batch_size=2, prefetch=2))
    with pytest.raises(InputError, match="to='jax' is invalid"):
        empty.batches(to="jax")
    with pytest.raises(InputError, match="prefetch=-1 is invalid"):
        empty.batches(prefetch=-1)


@pytest.mark.parametrize("kwargs", [{"batch_size": 2.5}, {"batch_size": "a"}, {"batch_size": True},
                                    {"prefetch": 1.5}, {"prefetch": "x"}, {"max_batches": -1},
                                    {"max_batches": "x"}, {"timeout": "x"}, {"timeout": -1}])
def test_bad_batches_arguments_are_refused_naming_the_value(plane, kwargs):
    """2.5 used to become 2, strings raised int()'s ValueError, max_batches='x' a TypeError
    from the first next()."""
    (name, value), = kwargs.items()
    with pytest.raises(InputError, match=f"batches: {name}={value!r} is invalid; expected"):
        plane.batches(**kwargs)


def test_close_stops_the_thread(plane):
    it = plane.batches(batch_size=8, prefetch=2)
    next(it)
    it.close()
    assert not it._thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)
    names = [t.name for t in threading.enumerate()]
    assert "replay-delivery" not in names


@pytest.mark.timeout(60, method="thread")
def test_close_from_another_thread_wakes_a_waiting_learner():
    """A learner blocked in next() (the rate limiter waits for actors) gets StopIteration when
    the plane is closed from another thread; it used to wait on the queue for ever."""
    from dask_research.replay import RateLimiter

    p = ExperiencePlane(CARTPOLE, capacity=100, rate_limiter=RateLimiter(
        samples_per_insert=1.0, tolerance=1.0, min_size_to_sample=10, timeout=3600))
    it = p.batches(batch_size=4, prefetch=2)
    got = []

    def learner():
        try:
            next(it)
            got.append("batch")
        except StopIteration:
            got.append("stop")

    t = threading.Thread(target=learner, daemon=True)
    t.start()
    time.sleep(0.3)                      # the learner is waiting in next()
    p.close()
    t.join(10)
    assert not t.is_alive() and got == ["stop"]


def test_a_closed_plane_refuses_use_and_takes_no_checkpoint_lease(tmp_path):
    """After close(), one transition used to be "ingested" into the released tier (the size
    grew), sampling and snapshots failed with numpy IndexErrors, and checkpoint() took the
    directory's lease and kept it, so no other plane could checkpoint there."""
    from dask_research.replay import PlaneClosedError

    p = ExperiencePlane(CARTPOLE, capacity=100)
    p.ingest(make_batch(10))
    p.close()
    one = {k: v[0] for k, v in make_batch(1).items()}
    for call in (lambda: p.ingest(one), lambda: p.add(**one), lambda: p.sample(2),
                 lambda: next(p.batches(batch_size=2, prefetch=0)), lambda: p.snapshot(),
                 lambda: p.checkpoint(tmp_path / "ck")):
        with pytest.raises(PlaneClosedError, match="is closed"):
            call()
    assert len(p) == 10
    other = ExperiencePlane(CARTPOLE, capacity=100)
    other.ingest(make_batch(5))
    other.checkpoint(tmp_path / "ck")            # the directory is free
    other.close()


def _nstep_reference(rew, done, nxt, keys, total, n, gamma):
    R, D, X, disc = [], [], [], []
    for k in keys:
        r, g, m = 0.0, 1.0, 0
        for j in range(n):
            if k + j >= total:
                break
            r += g * rew[k + j]
            g *= gamma
            m = j + 1
            if done[k + j]:
                break
        R.append(r), D.append(done[k + m - 1]), X.append(nxt[k + m - 1]), disc.append(gamma ** m)
    return np.array(R), np.array(D), np.array(X), np.array(disc)


def test_nstep_transform_matches_a_reference():
    plane = ExperiencePlane(CARTPOLE, capacity=500, seed=0)
    data = make_batch(400, seed=5)
    plane.ingest(data)
    with plane.batches(batch_size=128, prefetch=2, max_batches=4,
                       transforms=[NStepReturn(n=4, gamma=0.9)]) as it:
        for b in it:
            R, D, X, disc = _nstep_reference(data["reward"], data["done"], data["next_obs"],
                                             b.indices, 400, 4, 0.9)
            np.testing.assert_allclose(b.reward, R, rtol=1e-5)
            np.testing.assert_array_equal(b.done, D)
            np.testing.assert_array_equal(b.next_obs, X)
            np.testing.assert_allclose(b.discount, disc, rtol=1e-6)
            assert b.info["transform"] > 0


def test_user_callable_transform_and_normalize_to_torch():
    pytest.importorskip("torch")
    plane = ExperiencePlane(CARTPOLE, capacity=100, seed=0)
    plane.ingest(make_batch(100))

    def scale_reward(batch):
        batch.data["reward"] = batch.reward * 10        # in place: return None

    with plane.batches(batch_size=16, prefetch=1, to="torch", max_batches=3,
                       transforms=[scale_reward, Normalize("obs", 1.0, 2.0)]) as it:
        for b in it:
            raw = plane.gather_keys(b.indices)[0]
            np.testing.assert_allclose(b.reward.numpy(), raw["reward"] * 10, rtol=1e-6)
            np.testing.assert_allclose(b.obs.numpy(), (raw["obs"] - 1.0) / 2.0, rtol=1e-5)


def test_switch_interval_is_lowered_while_prefetching_and_restored(plane):
    import sys

    before = sys.getswitchinterval()
    with dask.config.set({"research.replay.switch-interval": 2e-4}):
        a = plane.batches(batch_size=8, prefetch=1)
        b = plane.batches(batch_size=8, prefetch=1)
    assert sys.getswitchinterval() == pytest.approx(2e-4)
    a.close()
    assert sys.getswitchinterval() == pytest.approx(2e-4)     # b still open
    b.close()
    assert sys.getswitchinterval() == before
    with dask.config.set({"research.replay.switch-interval": None}):
        with plane.batches(batch_size=8, prefetch=1):
            assert sys.getswitchinterval() == before
    with pytest.raises(InputError, match="switch_interval=0 is invalid"):
        plane.batches(prefetch=1, switch_interval=0)


def test_batch_is_a_mapping_that_copies_and_pickles(plane):
    import copy
    import pickle

    b = plane.sample(4)
    assert set(b) == set(plane.spec.names) and len(b) == 5 and b.size == 4
    c = pickle.loads(pickle.dumps(b))
    np.testing.assert_array_equal(c.obs, b.obs)
    np.testing.assert_array_equal(copy.copy(b).indices, b.indices)
    d = b.copy()
    d.obs[:] = 0
    assert not np.shares_memory(d.obs, b.obs)
    with pytest.raises(AttributeError, match="batch has no field 'nope'"):
        _ = b.nope
