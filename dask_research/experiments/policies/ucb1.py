"""UCB1: the default index, its baselines and its Policy; pure functions, no Dask, no asyncio.

The ledger (:mod:`~dask_research.experiments.ledger`) keeps per-branch statistics in numpy
arrays and the policy asks these functions for scores; they never look at anything else, so
they are tested without a cluster and benchmarked alone.

UCB1 (Auer, Cesa-Bianchi and Fischer 2002) with pending-aware counting:

.. math::

    s_i = \\bar x_i + c \\sqrt{\\ln N / n_i}, \\qquad n_i = \\text{runs}_i + \\text{pending}_i,
    \\qquad N = \\sum_j n_j

A branch with ``n_i == 0`` (neither results nor runs in flight) scores ``+inf``. A branch with
experiments in flight but no result yet has ``mean = 0`` (the pessimistic end of [0, 1]: the
"constant liar" that stops parallel slots piling onto one unknown branch). With one slot there
is never anything in flight at decision time, and the scores are plain UCB1.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies import select, ucb1_scores
>>> s = ucb1_scores(mean=[0.5, 0.9, 0.0], n=[2, 1, 0], c=2 ** 0.5)
>>> s.round(3).tolist()
[1.548, 2.382, inf]
>>> select(s, eligible=[True, True, False])
1
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .base import LedgerView, Policy

__all__ = ["UCB1Policy", "log_pulls", "ucb1_score", "ucb1_scores", "round_robin_scores",
           "greedy_scores"]

_INF = math.inf


def log_pulls(total: float | None, n: ArrayLike = ()) -> float:
    """``ln(total)``, the exploration term of the UCB family; ``total = sum(n)`` when not
    given, and 0 below two pulls (the bonus of the first pulls stays finite).

    >>> log_pulls(None, [1, 0]), round(log_pulls(4), 6)
    (0.0, 1.386294)
    """
    if total is None:
        total = float(np.sum(n))
    return math.log(total) if total > 1 else 0.0


def ucb1_score(mean: float, runs: int, pending: int, total: int, c: float) -> float:
    """UCB1 score of one branch; the scalar reference for :func:`ucb1_scores`.

    Parameters
    ----------
    mean : float
        Mean reward of completed runs (ignored while ``runs == 0``: taken as 0).
    runs, pending : int
        Completed experiments and experiments in flight on this branch.
    total : int
        ``runs + pending`` summed over all branches.
    c : float
        Exploration constant, ``>= 0``.

    Examples
    --------
    >>> ucb1_score(0.5, runs=1, pending=0, total=1, c=1.0)   # ln 1 = 0: no bonus
    0.5
    >>> ucb1_score(0.0, runs=0, pending=0, total=5, c=1.0)
    inf
    """
    n = runs + pending
    if n == 0:
        return _INF
    m = mean if runs > 0 else 0.0
    return m + c * math.sqrt(math.log(max(total, 1)) / n)


def ucb1_scores(
    mean: ArrayLike, n: ArrayLike, c: float, total: float | None = None
) -> np.ndarray:
    """Vectorised UCB1 over all branches.

    Parameters
    ----------
    mean : array of float
        Mean reward per branch; must be 0 (not ``nan``) where a branch has no result yet.
    n : array of int or float
        ``runs + pending`` per branch.
    c : float
        Exploration constant.
    total : float, optional
        ``sum(n)``; pass it when you maintain it incrementally (saves a reduction).

    Returns
    -------
    numpy.ndarray
        One score per branch, ``+inf`` where ``n == 0``.

    Examples
    --------
    >>> ucb1_scores([0.2, 0.0], [1, 0], c=1.0).tolist()
    [0.2, inf]
    """
    mean = np.asarray(mean, dtype=float)
    n = np.asarray(n, dtype=float)
    log_total = log_pulls(total, n)
    # n == 0 would divide by zero: divide by 1 there and overwrite with +inf afterwards
    scores = np.maximum(n, 1.0)
    np.divide(log_total, scores, out=scores)
    np.sqrt(scores, out=scores)
    scores *= c
    scores += mean
    scores[n == 0] = _INF
    return scores


def round_robin_scores(n: ArrayLike) -> np.ndarray:
    """Baseline: the branch with the fewest pulls first (ties by insertion order).

    >>> round_robin_scores([2, 1, 1]).tolist()
    [-2.0, -1.0, -1.0]
    """
    return -np.asarray(n, dtype=float)


def greedy_scores(mean: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Baseline: each branch once (``+inf`` while untried), then the highest mean.

    >>> greedy_scores([0.0, 0.4], [0, 2]).tolist()
    [inf, 0.4]
    """
    mean = np.asarray(mean, dtype=float)
    return np.where(np.asarray(n) == 0, _INF, mean)


class UCB1Policy(Policy):
    """UCB1 with pending pulls (:func:`.ucb1_scores`); the default."""

    name = "ucb1"
    untried_first = True
    fast_ucb1 = True

    def __init__(self, c: float = 2 ** 0.5):
        super().__init__()
        self.c = float(c)

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        return ucb1_scores(led.mean[:k], led.n[:k], self.c, float(led.total_n))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}
