"""KL-UCB for rewards in [0, 1] (Garivier and Cappé 2011), pending-aware.

The index of a branch is the largest ``q`` in ``[mean, 1]`` with

.. math::

    n_i \\, d(\\bar x_i, q) \\le \\ln N + c \\ln \\ln N,
    \\qquad d(p, q) = p \\ln\\frac{p}{q} + (1 - p) \\ln\\frac{1 - p}{1 - q}

(the Bernoulli Kullback-Leibler divergence), found by vectorised Newton steps to ``1e-13``.
``n_i = runs + pending``, ``N = sum(n)``; ``c = 0`` is the variant Garivier and Cappé recommend
in practice (``c = 3`` is the one their theorem covers). ``+inf`` where ``n_i == 0``. Pure numpy.

Examples
--------
>>> from dask_research.experiments.policies.klucb import kl_ucb_scores, bernoulli_kl
>>> s = kl_ucb_scores(mean=[0.5, 0.9, 0.0], n=[10, 10, 0])
>>> s.round(4).tolist()
[0.8357, 0.998, inf]
>>> round(float(10 * bernoulli_kl(0.5, s[0])), 4) == round(__import__("math").log(20), 4)
True
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .base import LedgerView, Policy
from .ucb1 import log_pulls

__all__ = ["KLUCBPolicy", "kl_ucb_scores", "bernoulli_kl"]

_EPS = 1e-15
_TOP = 1.0 - 1e-15          # the largest index below 1 that 1 - q still resolves


def bernoulli_kl(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """Bernoulli KL divergence ``d(p, q)`` (elementwise; ``0 ln 0 = 0``).

    >>> round(float(bernoulli_kl(0.5, 0.5)), 12)
    0.0
    """
    pa = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    qa = np.clip(np.asarray(q, dtype=float), _EPS, 1.0 - _EPS)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(pa > 0, pa * np.log(np.where(pa > 0, pa, 1.0) / qa), 0.0)
        b = np.where(pa < 1, (1 - pa) * np.log(np.where(pa < 1, 1 - pa, 1.0) / (1 - qa)), 0.0)
    return a + b


def kl_ucb_scores(mean: ArrayLike, n: ArrayLike, c: float = 0.0, total: float | None = None,
                  iterations: int = 60) -> np.ndarray:
    """Vectorised KL-UCB indices (branch order).

    Newton's method on ``f(q) = d(mean, q) - level`` started right of the root, at the smaller
    of Hoeffding's bound ``mean + sqrt(level / 2)`` (Pinsker) and ``1 - exp(-(level - C) /
    (1 - mean))`` (where ``-mean ln q >= 0`` is dropped); ``f`` is convex and increasing there,
    so the iterates fall monotonically to the root, to ``1e-13`` in about 5 steps.

    Parameters
    ----------
    mean : array of float in [0, 1]
        Mean reward of completed runs (0 where none).
    n : array of int or float
        ``runs + pending``.
    c : float
        Weight of the ``ln ln N`` term (0 in practice).
    total : float, optional
        ``sum(n)``.
    iterations : int
        Upper bound on Newton steps.
    """
    p = np.clip(np.asarray(mean, dtype=float), 0.0, 1.0)
    n = np.asarray(n, dtype=float)
    log_total = log_pulls(total, n)
    bonus = log_total + (c * math.log(log_total) if log_total > 1 else 0.0)
    level = bonus / np.maximum(n, 1.0)
    inner = p < 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # d(p, q) = C - p ln q - (1 - p) ln(1 - q), C = p ln p + (1 - p) ln(1 - p)
        const = (np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
                 + np.where(inner, (1 - p) * np.log(np.where(inner, 1 - p, 1.0)), 0.0))
        start = 1.0 - np.exp(-(level - const) / np.where(inner, 1 - p, 1.0))
        q = np.minimum(np.minimum(p + np.sqrt(level / 2.0), start), _TOP)
        q = np.where(inner & (level > 0), np.maximum(q, p), p)
        for _ in range(iterations):
            f = const - p * np.log(q) - (1 - p) * np.log1p(-q) - level
            step = np.where(q > p, f * q * (1 - q) / (q - p), 0.0)
            q_new = np.clip(q - step, p, np.maximum(p, _TOP))
            moved = np.abs(q_new - q).max(initial=0.0)
            q = q_new
            if not moved >= 1e-13:          # converged (or nothing left to move)
                break
    q[n == 0] = math.inf
    return q


class KLUCBPolicy(Policy):
    """KL-UCB for rewards in [0, 1] (:func:`.klucb.kl_ucb_scores`)."""

    name = "kl-ucb"
    untried_first = True

    def __init__(self, c: float = 0.0):
        super().__init__()
        self.c = float(c)

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        return kl_ucb_scores(led.mean[:k], led.n[:k], self.c, float(led.total_n))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}
