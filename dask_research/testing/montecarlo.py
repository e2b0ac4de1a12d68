"""Hypothesis strategies for Monte-Carlo accumulators and mergers.

Examples
--------
>>> from hypothesis import given
>>> from dask_research.testing.montecarlo import sample_arrays
>>> @given(sample_arrays())
... def test_finite(y):
...     assert (y == y).all()
>>> test_finite()
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = ["sample_arrays", "split_points", "moments_states"]

#: The histogram range the strategies use.
RANGE = (-100.0, 100.0)


def sample_arrays(min_size: int = 0, max_size: int = 200, bound: float = 1e3) -> st.SearchStrategy:
    """1-d float64 arrays of finite values (some outside :data:`RANGE`, for under/overflow)."""
    elements = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return hnp.arrays(np.float64, st.integers(min_size, max_size), elements=elements)


def split_points(y: np.ndarray, draw, pieces: int = 4) -> list[int]:
    """Sorted cut points that split ``y`` into up to ``pieces`` (possibly empty) pieces."""
    cuts = sorted(draw(st.lists(st.integers(0, y.size), min_size=pieces - 1, max_size=pieces - 1)))
    return [0, *cuts, y.size]


@st.composite
def moments_states(draw, bins: int = 16, min_size: int = 0, max_size: int = 200):
    """A :class:`~dask_research.montecarlo.Moments` built from a random finite sample."""
    from ..montecarlo.accumulators import Moments

    y = draw(sample_arrays(min_size, max_size))
    return Moments.from_samples(y, RANGE, bins)
