"""Samplers match their distributions (chi-square), priorities update, nothing stale is sampled."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import CARTPOLE, make_batch
from scipy import stats

from dask_research.exceptions import InputError
from dask_research.replay import EmptyPlaneError, ExperiencePlane, PrioritizedSampler, RecentSampler, UniformSampler
from dask_research.replay.samplers._sumtree import SumTree

SPEC = {"key": ((), "int64")}
ALPHA = 1e-3          # significance level of the goodness-of-fit tests (fixed seeds)


def _plane(cap, n, sampler, seed=1):
    plane = ExperiencePlane(SPEC, capacity=cap, sampler=sampler, seed=seed)
    for s in range(0, n, 37):                         # odd chunks: the ring wraps mid-batch
        plane.ingest({"key": np.arange(s, min(s + 37, n))})
    return plane


def _counts(plane, draws, batch=1000):
    keys = np.concatenate([plane.sample(batch).indices for _ in range(draws // batch)])
    lo = plane.total - len(plane)
    return np.bincount(keys - lo, minlength=len(plane)), keys


@pytest.mark.parametrize("cap, n", [(500, 300), (500, 1234)])   # partly filled; wrapped
def test_uniform_matches_uniform_distribution(cap, n):
    plane = _plane(cap, n, UniformSampler())
    counts, keys = _counts(plane, 200_000)
    assert keys.min() >= plane.total - len(plane) and keys.max() < plane.total
    assert stats.chisquare(counts).pvalue > ALPHA


def test_uniform_chi_square_detects_a_biased_sampler():
    """The test above has power: a sampler that under-weights one slot by 30 % fails it."""
    class Biased(UniformSampler):
        def sample(self, cursor, size, batch_size, rng):
            j, w = super().sample(cursor, size, batch_size, rng)
            redo = (j == 0) & (rng.random(batch_size) < 0.3)
            j[redo] = rng.integers(1, size, int(redo.sum()))
            return j, w

    plane = _plane(50, 50, Biased())
    counts, _ = _counts(plane, 200_000)
    assert stats.chisquare(counts).pvalue < ALPHA


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_prioritized_matches_priorities(alpha):
    cap = 400
    plane = _plane(cap, 1000, PrioritizedSampler(alpha=alpha, beta=0.4, eps=0.0))
    rng = np.random.default_rng(7)
    keys = np.arange(plane.total - cap, plane.total)
    pr = rng.uniform(0.1, 10.0, cap)
    pr[:40] = 0.0                                     # zero priority: never sampled
    assert plane.update_priorities(keys, pr) == cap
    counts, _ = _counts(plane, 300_000)
    expected = pr ** alpha / (pr ** alpha).sum() * counts.sum()
    assert counts[:40].sum() == 0
    assert stats.chisquare(counts[40:], expected[40:]).pvalue > ALPHA


def test_importance_weights():
    s = PrioritizedSampler(alpha=0.5, beta=0.7, eps=0.0)
    s.attach(8)
    s.on_insert(0, 8)
    pr = np.array([1.0, 4.0, 9.0, 16.0, 1.0, 2.0, 3.0, 4.0])
    s.update(np.arange(8), pr)
    slots, w = s.sample(cursor=0, size=8, batch_size=64, rng=np.random.default_rng(0))
    p = pr ** 0.5
    want = (p[slots] / p.min()) ** -0.7          # (N P_i)^-beta / max_j (N P_j)^-beta
    np.testing.assert_allclose(w, want, rtol=1e-6)
    assert w.max() <= 1.0


def test_new_transitions_get_the_max_priority_and_updates_land():
    plane = _plane(16, 8, PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0))
    plane.update_priorities(np.array([0, 1]), np.array([5.0, 0.5]))
    plane.ingest({"key": np.array([8, 9])})
    leaves = plane.sampler.tree.leaves(np.arange(10))
    np.testing.assert_allclose(leaves, [5.0, 0.5] + [1.0] * 6 + [5.0, 5.0])
    with pytest.raises(InputError, match="priorities=-1.0 is invalid"):
        plane.update_priorities(np.array([0]), np.array([-1.0]))
    with pytest.raises(InputError, match="one per index"):
        plane.update_priorities(np.array([0, 1]), np.array([1.0]))


def test_stale_priority_updates_are_dropped():
    plane = _plane(10, 10, PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0))
    b = plane.sample(64)
    plane.ingest({"key": np.arange(10, 15)})              # overwrites keys 0..4
    applied = plane.update_priorities(b.indices, np.full(64, 100.0))
    stale = b.indices < 5
    assert applied == int((~stale).sum())
    assert plane.stats()["stale_priority_updates"] == int(stale.sum())
    # slots 0..4 now hold keys 10..14, which entered with the max priority of their time (1.0);
    # the stale update of 100 for keys 0..4 must not have landed on them
    np.testing.assert_array_equal(plane.sampler.tree.leaves(np.arange(5)), 1.0)


@pytest.mark.parametrize("sampler", [UniformSampler(), PrioritizedSampler(), RecentSampler(window=5)])
def test_nothing_stale_is_sampled_after_overwrite(sampler):
    plane = ExperiencePlane(CARTPOLE, capacity=20, sampler=sampler, seed=3)
    for start in range(0, 95, 19):
        plane.ingest(make_batch(19, start=start))
        for _ in range(20):
            b = plane.sample(32)
            assert (b.indices >= plane.total - len(plane)).all()
            np.testing.assert_array_equal(b.action, b.indices)     # the record is the key's
    if isinstance(sampler, RecentSampler):
        assert (plane.sample(500).indices >= plane.total - 5).all()


def test_recent_sampler_distribution():
    plane = _plane(100, 250, RecentSampler(window=30))
    keys = np.concatenate([plane.sample(1000).indices for _ in range(60)])
    assert keys.min() >= 220 and keys.max() <= 249
    assert stats.chisquare(np.bincount(keys - 220, minlength=30)).pvalue > ALPHA


def test_empty_plane_refuses_to_sample():
    plane = ExperiencePlane(SPEC, capacity=4)
    with pytest.raises(EmptyPlaneError, match="empty experience plane"):
        plane.sample(2)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 300), data=st.data())
def test_sum_tree_agrees_with_numpy(cap, data):
    t = SumTree(cap, max_top=data.draw(st.sampled_from([1, 4, 2048])))
    leaves = np.zeros(cap)
    for _ in range(data.draw(st.integers(1, 5))):
        idx = np.array(data.draw(st.lists(st.integers(0, cap - 1), min_size=1, max_size=20)))
        val = np.array(data.draw(st.lists(st.floats(0.0, 100.0, allow_subnormal=False), min_size=len(idx),
                                          max_size=len(idx))))
        t.set(idx, val, np.where(val > 0, val, np.inf))
        for i, v in zip(idx, val):       # numpy fancy assignment: the last duplicate wins
            leaves[i] = v
        lo = data.draw(st.integers(0, cap - 1))
        hi = data.draw(st.integers(lo, cap))
        t.set_range(lo, hi, 2.5)
        leaves[lo:hi] = 2.5
    assert np.isclose(t.total, leaves.sum())
    pos = leaves[leaves > 0]
    assert t.min == (pos.min() if len(pos) else np.inf)
    if leaves.sum() > 0:
        u = np.random.default_rng(0).random(50) * leaves.sum()
        got = t.find(u)
        assert (leaves[got] > 0).all()
        want = np.searchsorted(np.cumsum(leaves), u, side="right")
        # u can round up to the total: the answer is then the last leaf with mass
        np.testing.assert_array_equal(got, np.minimum(want, np.flatnonzero(leaves > 0)[-1]))


def test_all_zero_priorities_are_refused():
    """Up front, by the update that would make them so (nothing applied); a sampler used on its
    own without any positive leaf refuses to sample."""
    plane = _plane(8, 8, PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0))
    with pytest.raises(InputError, match="expected at least one positive priority"):
        plane.update_priorities(np.arange(8), np.zeros(8))
    assert len(plane.sample(4).indices) == 4
    s = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0)
    s.attach(4)
    with pytest.raises(InputError, match="expected at least one positive priority"):
        s.sample(cursor=0, size=4, batch_size=2, rng=np.random.default_rng(0))


@pytest.mark.parametrize("kwargs, name", [({"alpha": float("inf")}, "alpha"), ({"beta": float("nan")}, "beta"),
                                          ({"eps": float("inf")}, "eps"), ({"alpha": True}, "alpha"),
                                          ({"alpha": 40.0, "eps": 1e10}, "eps")])
def test_sampler_parameters_are_finite_and_keep_leaves_bounded(kwargs, name):
    with pytest.raises(InputError, match=f"PrioritizedSampler: {name}="):
        PrioritizedSampler(**{"alpha": 0.6, "beta": 0.4, **kwargs})


@settings(max_examples=60, deadline=None)
@given(pr=st.lists(st.floats(0.0, 1e300, allow_subnormal=False), min_size=1, max_size=8),
       alpha=st.sampled_from([0.5, 1.0, 2.0]))
def test_accepted_priorities_keep_the_sum_finite_and_refused_ones_change_nothing(pr, alpha):
    """Whatever update is accepted leaves a finite, positive mass; a refused one changes no leaf."""
    plane = _plane(16, 16, PrioritizedSampler(alpha=alpha, beta=1.0, eps=0.0))
    before = plane.sampler.leaves(np.arange(16))
    try:
        plane.update_priorities(np.arange(len(pr)), np.array(pr))
    except InputError:
        np.testing.assert_array_equal(plane.sampler.leaves(np.arange(16)), before)
    mass = plane.sampler.mass(len(plane))
    assert np.isfinite(mass) and mass > 0
    keys = plane.sample(64).indices
    assert (plane.sampler.leaves(keys % 16) > 0).all()
