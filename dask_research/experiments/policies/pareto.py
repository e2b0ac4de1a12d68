"""Pareto UCB1 for vector rewards (Drugan and Nowé 2013), pending-aware.

Each branch gets one upper confidence index per objective,

.. math::

    u_{i,d} = \\bar x_{i,d} + \\sqrt{\\frac{2 \\ln\\left(N \\, (D \\, |A^*|)^{1/4}\\right)}{n_i}},

with ``D`` objectives, ``|A*|`` the size of the Pareto front (estimated as the number of
branches whose mean vectors are non-dominated, at least 1), ``n_i = runs + pending`` and
``N = sum(n)``. The pick is uniform, with a seeded generator, among the eligible branches whose
index vectors no other eligible branch dominates. All objectives are maximised here: the
scheduler flips ``"min"`` objectives before they reach these functions. Pure numpy.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies.pareto import (pareto_front, pareto_select,
...                                                      pareto_ucb1_indices)
>>> means = np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5], [0.2, 0.2]])
>>> pareto_front(means).tolist()
[True, True, True, False]
>>> u = pareto_ucb1_indices(means, n=[50, 50, 50, 50])
>>> i, front = pareto_select(u, [True] * 4, np.random.default_rng(1))
>>> front.tolist(), i in (0, 1, 2)
([True, True, True, False], True)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .base import LedgerView, Policy

__all__ = ["ParetoUCB1Policy", "dominates", "pareto_front", "pareto_ucb1_indices", "pareto_select"]


def dominates(a: ArrayLike, b: ArrayLike) -> bool:
    """``a`` is at least as good as ``b`` everywhere and better somewhere (maximising).

    >>> dominates([1, 2], [1, 1]), dominates([1, 2], [2, 1]), dominates([1, 1], [1, 1])
    (True, False, False)
    """
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return bool((a_ >= b_).all() and (a_ > b_).any())


def pareto_front(vectors: ArrayLike, mask: ArrayLike | None = None) -> np.ndarray:
    """Boolean mask of the rows not dominated by any other row (among ``mask``, if given).

    Rows outside ``mask`` are ``False`` and dominate nothing. ``+inf`` entries are allowed.
    """
    v = np.asarray(vectors, dtype=float)
    k = v.shape[0]
    m = np.ones(k, bool) if mask is None else np.asarray(mask, dtype=bool)
    sub = v[m]
    if len(sub) == 0:
        return np.zeros(k, bool)
    # dominated[j] = any row r with r >= sub[j] everywhere and r > sub[j] somewhere
    ge = (sub[:, None, :] >= sub[None, :, :]).all(axis=2)
    gt = (sub[:, None, :] > sub[None, :, :]).any(axis=2)
    dominated = (ge & gt).any(axis=0)
    out = np.zeros(k, bool)
    out[np.flatnonzero(m)] = ~dominated
    return out


def pareto_ucb1_indices(means: ArrayLike, n: ArrayLike, front_size: int | None = None,
                        total: float | None = None) -> np.ndarray:
    """Per-objective Pareto UCB1 indices, shape ``(branches, objectives)``.

    Parameters
    ----------
    means : array, shape (k, D)
        Mean reward vectors of completed runs (0 where a branch has none), maximised.
    n : array, shape (k,)
        ``runs + pending``.
    front_size : int, optional
        ``|A*|``; default: the size of the Pareto front of ``means`` among tried branches.
    total : float, optional
        ``sum(n)``.
    """
    mu = np.asarray(means, dtype=float)
    n_ = np.asarray(n, dtype=float)
    d = mu.shape[1]
    if total is None:
        total = float(n_.sum())
    if front_size is None:
        tried = n_ > 0
        front_size = int(pareto_front(mu, tried).sum()) if tried.any() else 1
    front_size = max(int(front_size), 1)
    arg = total * (d * front_size) ** 0.25
    log_arg = math.log(arg) if arg > 1 else 0.0
    bonus = np.sqrt(2.0 * log_arg / np.maximum(n_, 1.0))
    out = mu + bonus[:, None]
    out[n_ == 0] = math.inf
    return out


def pareto_select(indices: ArrayLike, eligible: ArrayLike,
                  rng: np.random.Generator) -> tuple[int | None, np.ndarray]:
    """``(pick, front mask)``: a uniform, seeded pick among eligible non-dominated branches."""
    el = np.asarray(eligible, dtype=bool)
    front = pareto_front(indices, el)
    cands = np.flatnonzero(front)
    if len(cands) == 0:
        return None, front
    return int(cands[rng.integers(len(cands))]), front


class ParetoUCB1Policy(Policy):
    """Pareto UCB1 over vector rewards (:mod:`.pareto`); a seeded uniform pick in the front.

    ``scores`` (what ``select`` events record) is the mean of each branch's per-objective
    indices; ``last_front`` holds the non-dominated mask of the latest decision.
    """

    name = "pareto-ucb1"
    needs_vector = True

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = int(seed)
        self.rng = self._rng = np.random.default_rng(self.seed)
        self.last_front: np.ndarray = np.zeros(0, bool)
        self._indices: np.ndarray | None = None

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        mu = led.vector_means()
        self._indices = pareto_ucb1_indices(mu, led.n[:k], total=float(led.total_n))
        return self._indices.mean(axis=1)

    def choose(self, led: LedgerView, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        self.position = 0
        assert self._indices is not None
        i, self.last_front = pareto_select(self._indices, eligible, self._rng)
        return i

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed}
