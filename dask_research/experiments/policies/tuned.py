"""UCB1-Tuned (Auer, Cesa-Bianchi and Fischer 2002, section 4): UCB1 with a variance bound.

.. math::

    s_i = \\bar x_i + \\sqrt{\\frac{\\ln N}{n_i} \\min\\left(\\tfrac14, V_i\\right)}, \\qquad
    V_i = \\hat\\sigma_i^2 + \\sqrt{\\frac{2 \\ln N}{n_i}}

``n_i = runs + pending`` (experiments in flight count as pulls, as in :mod:`.ucb1`), the mean
and the variance ``sigma^2 = sq_sum / runs - mean^2`` come from completed runs (0 before the
first one), ``N = sum(n)``. ``+inf`` where ``n_i == 0``. Pure numpy, no Dask.

Examples
--------
>>> from dask_research.experiments.policies.tuned import ucb1_tuned_scores
>>> ucb1_tuned_scores(mean=[0.5, 0.5], sq_sum=[0.5, 0.25], runs=[2, 1], n=[2, 1]).round(4).tolist()
[0.8706, 1.0241]
>>> ucb1_tuned_scores([0.2, 0.0], [0.04, 0.0], [1, 0], [1, 0]).tolist()   # ln 1 = 0: no bonus
[0.2, inf]
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from .base import LedgerView, Policy
from .ucb1 import log_pulls

__all__ = ["UCB1TunedPolicy", "ucb1_tuned_scores", "ucb1_tuned_score"]


def ucb1_tuned_score(mean: float, sq_sum: float, runs: int, pending: int, total: int) -> float:
    """Scalar reference of :func:`ucb1_tuned_scores`.

    >>> round(ucb1_tuned_score(0.5, 0.5, runs=2, pending=0, total=4), 6)
    0.916277
    """
    n = runs + pending
    if n == 0:
        return math.inf
    m = mean if runs else 0.0
    var = max(sq_sum / runs - m * m, 0.0) if runs else 0.0
    log_total = log_pulls(total)
    v = var + math.sqrt(2.0 * log_total / n)
    return m + math.sqrt(log_total / n * min(0.25, v))


def ucb1_tuned_scores(mean: ArrayLike, sq_sum: ArrayLike, runs: ArrayLike, n: ArrayLike,
                      total: float | None = None) -> np.ndarray:
    """Vectorised UCB1-Tuned over all branches (branch order).

    Parameters
    ----------
    mean : array of float
        Mean reward of completed runs; 0 where a branch has none.
    sq_sum : array of float
        Sum of squared rewards of completed runs.
    runs : array of int
        Completed runs per branch (the variance's denominator).
    n : array of int or float
        ``runs + pending`` per branch.
    total : float, optional
        ``sum(n)``.
    """
    mean = np.asarray(mean, dtype=float)
    sq_sum = np.asarray(sq_sum, dtype=float)
    runs = np.asarray(runs, dtype=float)
    n = np.asarray(n, dtype=float)
    log_total = log_pulls(total, n)
    safe_runs = np.maximum(runs, 1.0)
    var = np.where(runs > 0, np.maximum(sq_sum / safe_runs - mean * mean, 0.0), 0.0)
    safe_n = np.maximum(n, 1.0)
    v = var + np.sqrt(2.0 * log_total / safe_n)
    scores = mean + np.sqrt(log_total / safe_n * np.minimum(0.25, v))
    scores[n == 0] = math.inf
    return scores


class UCB1TunedPolicy(Policy):
    """UCB1-Tuned (:func:`.tuned.ucb1_tuned_scores`)."""

    name = "ucb1-tuned"
    untried_first = True

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        return ucb1_tuned_scores(led.mean[:k], led.sq_sum[:k], led.runs[:k], led.n[:k],
                                 float(led.total_n))
