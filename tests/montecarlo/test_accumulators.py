import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.montecarlo import Moments, merge_moments
from dask_research.montecarlo.accumulators import MomentsReducer
from dask_research.testing.montecarlo import RANGE, moments_states, sample_arrays

BINS = 16


def _direct(y: np.ndarray) -> dict:
    """Moments computed the slow, obvious way."""
    m = y.mean()
    d = y - m
    return {"mean": m, "m2": (d**2).sum(), "m3": (d**3).sum(), "m4": (d**4).sum()}


def _close(a, b, scale):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * scale)


@given(sample_arrays(min_size=1), st.data())
def test_merging_pieces_equals_accumulating_the_whole(y, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, y.size), min_size=3, max_size=3)))
    pieces = [y[a:b] for a, b in zip([0, *cuts], [*cuts, y.size])]
    acc = Moments.empty(RANGE, BINS)
    for p in pieces:
        acc = merge_moments(acc, Moments.from_samples(p, RANGE, BINS))
    whole = Moments.from_samples(y, RANGE, BINS)
    # Integer fields exactly, floats to rounding.
    assert acc.n == whole.n == y.size
    assert np.array_equal(acc.hist, whole.hist) and acc.hist.sum() == y.size
    assert acc.min == y.min() and acc.max == y.max()
    ref = _direct(y)
    spread = float(np.abs(y).max()) + 1.0
    assert _close(acc.mean, ref["mean"], spread)
    for k, p in (("m2", 2), ("m3", 3), ("m4", 4)):
        assert _close(getattr(acc, k), ref[k], y.size * spread**p), k


@given(moments_states(), moments_states())
def test_merge_is_exactly_commutative(a, b):
    assert merge_moments(a, b) == merge_moments(b, a)


@given(moments_states())
def test_empty_is_an_exact_identity(a):
    e = Moments.empty(RANGE, BINS)
    assert merge_moments(a, e) == a and merge_moments(e, a) == a


@settings(max_examples=200)
@given(moments_states(min_size=1), moments_states(min_size=1), moments_states(min_size=1))
def test_merge_is_associative_within_rounding(a, b, c):
    left = merge_moments(merge_moments(a, b), c)
    right = merge_moments(a, merge_moments(b, c))
    assert left.n == right.n and np.array_equal(left.hist, right.hist)
    assert left.min == right.min and left.max == right.max
    scale = max(abs(a.mean), abs(b.mean), abs(c.mean), 1.0) * 2e3
    assert _close(left.mean, right.mean, scale)
    for k, p in (("m2", 2), ("m3", 3), ("m4", 4)):
        assert _close(getattr(left, k), getattr(right, k), left.n * scale**p), k


def test_histogram_uses_half_open_bins_and_outer_counters():
    y = np.array([-101.0, -100.0, -99.99, 0.0, 99.99, 100.0, 250.0])
    m = Moments.from_samples(y, RANGE, 4)
    # [-100,-50) [-50,0) [0,50) [50,100); 100.0 itself is overflow
    assert m.hist.tolist() == [1, 2, 0, 1, 1, 2]
    ref, _ = np.histogram(y[(y >= -100) & (y < 100)], bins=4, range=RANGE)
    assert m.hist[1:-1].tolist() == ref.tolist()


def test_accumulator_is_fixed_size_and_small():
    small = Moments.from_samples(np.zeros(10), (0.0, 1.0), 256)
    big = Moments.from_samples(np.random.default_rng(0).random(1_000_000), (0.0, 1.0), 256)
    assert small.nbytes == big.nbytes <= 4096
    import pickle

    assert len(pickle.dumps(big)) <= 4096


@given(moments_states())
def test_dict_round_trip_keeps_every_bit(a):
    assert Moments.from_dict(a.to_dict()) == a


def test_reducer_protocol_of_the_builtin():
    r = MomentsReducer((0.0, 1.0), 8)
    s = r.update(r.init(), np.array([0.1, 0.2, 0.9]))
    assert r.finalize(s).n == 3 and r.merge(s, r.init()) == s


# -- invariants a stored (untrusted) accumulator must satisfy (security review, finding 3) ----------
@settings(max_examples=300, deadline=None)
@given(sample_arrays(min_size=1, bound=1e12), st.integers(1, 6), st.floats(1e-6, 1e6))
def test_every_state_samples_can_produce_passes_the_check(y, pieces, scale):
    y = y * scale
    parts = [Moments.from_samples(p, RANGE, 16) for p in np.array_split(y, pieces)]
    acc = Moments.empty(RANGE, 16)
    for p in parts:
        Moments.from_dict(p.to_dict())
        acc = merge_moments(acc, p)
        Moments.from_dict(acc.to_dict())          # merged states too


def test_a_constant_sample_passes_the_bounds_despite_rounding():
    for v in (0.1, 1e10 / 3, -7.3e-200, 123456.789):
        Moments.from_samples(np.full(1000, v), RANGE, 16).check()


def _forged(**change):
    import dataclasses

    m = Moments.from_samples(np.random.default_rng(3).normal(0, 20, 256), RANGE, 16)
    return dataclasses.replace(m, **change)


def test_edits_that_keep_the_old_invariants_are_refused():
    import pytest

    m = _forged()
    wrapped = m.hist.copy()
    wrapped[1:5] += 2**62                      # an int64 sum wraps back to n
    cases = {
        "outside \\[min, max\\]": _forged(mean=1e6),
        "exceeds": _forged(m2=m.m2 * 1e3),
        "m4=.* exceeds": _forged(m4=m.m4 * 1e9),
        "not n": _forged(hist=wrapped),
        "do not match min": _forged(min=m.min - 60.0),
        "do not match min=.* and max": _forged(max=m.max + 60.0),
    }
    for pattern, state in cases.items():
        with pytest.raises(ValueError, match=pattern):
            state.check()
