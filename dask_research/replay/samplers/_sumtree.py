"""A vectorised sum-tree and min-tree over ``capacity`` leaves (numpy arrays, no Python loops
over items).

Layout: flat ``float64`` arrays of ``2 * L`` nodes (``L`` the next power of two; node 1 the
root, node ``i`` has children ``2i`` and ``2i + 1``, leaf ``j`` is node ``L + j``). Only the
bottom ``depth - top`` levels are maintained: the ``2**top`` nodes of level ``top`` (at most
2048) are the roots of a forest, and the part of the tree above them is replaced by a
``cumsum`` + ``searchsorted`` over that level when sampling, which costs about as much as two
tree levels but saves a dozen. With 1M leaves a batched update or search walks 9 levels.

- Batched update: set the leaves, then recompute the parents one level at a time for all
  touched leaves at once (duplicate parents compute the same value, so no ``unique`` is needed).
  Contiguous leaf ranges (ingest) use slices instead of index arrays.
- Batched search: ``searchsorted`` on the cumulative masses of the top level, then one level at
  a time for the whole batch, five vector ops per level with preallocated buffers.

Examples
--------
>>> import numpy as np
>>> t = SumTree(5)
>>> t.set(np.array([0, 3]), np.array([1.0, 3.0]))
>>> t.total, t.min
(4.0, 1.0)
>>> t.find(np.array([0.5, 1.5, 3.99])).tolist()
[0, 3, 3]
>>> t.set(np.array([1, 2]), np.array([MAX_LEAF, MAX_LEAF]))      # the bound keeps the sum finite
>>> t.total < float("inf"), t.find(np.array([0.25 * t.total, 0.75 * t.total])).tolist()
(True, [1, 2])
"""
from __future__ import annotations

import numpy as np

#: the forest's roots: the deepest level with at most this many nodes (a cumsum over it
#: costs about two tree levels)
MAX_TOP = 2048
#: the largest leaf a tree may hold: the sum of 2**62 such leaves (more than any ring has slots)
#: is still a finite float64 (below 1.8e308), so the sum, every partial sum and every draw stay
#: finite; the prioritized sampler refuses priorities whose leaf would exceed it
MAX_LEAF = 1e280


class SumTree:
    """Sum and min over ``capacity`` non-negative leaves; empty leaves are 0 (sum), +inf (min)."""

    def __init__(self, capacity: int, max_top: int = MAX_TOP):
        self.capacity = int(capacity)
        L = 1
        while L < self.capacity:
            L *= 2
        self.L = L
        self.depth = L.bit_length() - 1
        self.top = min(self.depth, max(0, max_top.bit_length() - 1))   # level of the forest roots
        self.levels = self.depth - self.top                              # levels walked per search
        self.sum = np.zeros(2 * L, dtype=np.float64)
        self.mn = np.full(2 * L, np.inf, dtype=np.float64)
        t = 1 << self.top
        self._roots = self.sum[t:2 * t]
        self._mroots = self.mn[t:2 * t]

    # --- reads ------------------------------------------------------------------------
    @property
    def total(self) -> float:
        return float(self._roots.sum())

    @property
    def min(self) -> float:
        return float(self._mroots.min())

    def leaves(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Leaf values: a view for a slice, a copy for an index array."""
        if isinstance(idx, slice):
            return self.sum[self.L:self.L + self.capacity][idx]
        return self.sum[self.L + np.asarray(idx)]

    def find(self, u: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
        """Leaf of each prefix mass ``u`` (``0 <= u < total``): the leaf ``j`` with
        ``sum(leaves[:j]) <= u < sum(leaves[:j + 1])``. Never returns a zero-mass leaf while
        the total is positive. ``cum`` may pass ``np.cumsum`` of the top level if known."""
        roots = self._roots
        if cum is None:
            cum = np.cumsum(roots)
        u = np.array(u, dtype=np.float64, copy=True)
        j = np.searchsorted(cum, u, side="right")
        np.minimum(j, len(cum) - 1, out=j)
        u -= cum[j]
        u += roots[j]
        np.maximum(u, 0.0, out=u)
        idx = j
        idx += 1 << self.top
        if self.levels:
            s = self.sum
            left = np.empty(len(u), dtype=np.float64)
            go = np.empty(len(u), dtype=bool)
            for _ in range(self.levels):
                np.left_shift(idx, 1, out=idx)
                s.take(idx, out=left)
                np.greater_equal(u, left, out=go)
                np.subtract(u, left, out=u, where=go)
                np.add(idx, go, out=idx, casting="unsafe")
        zero = self.sum[idx] <= 0.0
        idx -= self.L
        if zero.any():            # round-off walked into an empty right sibling: rare, slow path
            idx[zero] = self._nearest_positive(idx[zero])
        return idx

    def _nearest_positive(self, idx: np.ndarray) -> np.ndarray:
        pos = np.flatnonzero(self.sum[self.L:self.L + self.capacity] > 0)
        k = np.clip(np.searchsorted(pos, idx), 1, len(pos)) - 1
        return pos[k]

    # --- writes -----------------------------------------------------------------------
    def set(self, idx: np.ndarray, values: np.ndarray | float,
            min_values: np.ndarray | float | None = None) -> None:
        """Set leaves ``idx`` to ``values`` (min-tree to ``min_values``, default ``values``)."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) == 0:
            return
        s, m = self.sum, self.mn
        i = idx + self.L
        s[i] = values
        m[i] = values if min_values is None else min_values
        for _ in range(self.levels):
            np.right_shift(i, 1, out=i)
            l = i << 1
            r = l + 1
            s[i] = s[l] + s[r]
            m[i] = np.minimum(m[l], m[r])

    def set_range(self, lo: int, hi: int, value: float, min_value: float | None = None) -> None:
        """Set leaves ``lo`` to ``hi - 1`` to one value, updating parents with slices."""
        if hi <= lo:
            return
        s, m = self.sum, self.mn
        a, b = lo + self.L, hi - 1 + self.L
        s[a:b + 1] = value
        m[a:b + 1] = value if min_value is None else min_value
        for _ in range(self.levels):
            a >>= 1
            b >>= 1
            np.add(s[2 * a:2 * b + 2:2], s[2 * a + 1:2 * b + 2:2], out=s[a:b + 1])
            np.minimum(m[2 * a:2 * b + 2:2], m[2 * a + 1:2 * b + 2:2], out=m[a:b + 1])

    def load(self, leaves: np.ndarray, min_leaves: np.ndarray | None = None) -> None:
        """Rebuild the tree from ``capacity`` leaf values (O(capacity))."""
        L = self.L
        self.sum[:] = 0.0
        self.mn[:] = np.inf
        self.sum[L:L + self.capacity] = leaves
        self.mn[L:L + self.capacity] = leaves if min_leaves is None else min_leaves
        n = L
        for _ in range(self.levels):
            h = n // 2
            np.add(self.sum[n:2 * n:2], self.sum[n + 1:2 * n:2], out=self.sum[h:n])
            np.minimum(self.mn[n:2 * n:2], self.mn[n + 1:2 * n:2], out=self.mn[h:n])
            n = h
