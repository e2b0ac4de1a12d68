"""Discounted UCB for drifting rewards (Garivier and Moulines 2011), pending-aware.

Every applied result multiplies every branch's discounted count ``N_i`` and discounted reward
sum ``S_i`` by ``gamma`` before it is added to its own branch, so old evidence fades with a
half-life of ``ln 2 / -ln gamma`` results. The score is

.. math::

    s_i = S_i / N_i + c \\sqrt{\\ln n_\\gamma / (N_i + \\mathrm{pending}_i)},
    \\qquad n_\\gamma = \\textstyle\\sum_j (N_j + \\mathrm{pending}_j)

(``c = sqrt 2`` is D-UCB with ``B = 1`` and ``xi = 1/2``). ``+inf`` for branches that have
neither discounted evidence nor experiments in flight. With ``gamma = 1`` it is UCB1.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies.discounted import discount_update, discounted_ucb_scores
>>> n, s = np.zeros(2), np.zeros(2)
>>> for arm, r in [(0, 1.0), (0, 1.0), (1, 0.5)]:
...     discount_update(n, s, arm, r, gamma=0.5)
>>> n.tolist(), s.tolist()
([0.75, 1.0], [0.75, 0.5])
>>> discounted_ucb_scores(n, s, pending=[0, 0], c=0.0).tolist()
[1.0, 0.5]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..types import Hypothesis
from .base import LedgerView, Policy
from .ucb1 import log_pulls

__all__ = ["DiscountedUCBPolicy", "discounted_ucb_scores", "discount_update"]


def discount_update(disc_n: np.ndarray, disc_sum: np.ndarray, i: int, reward: float,
                    gamma: float) -> None:
    """Fade every branch's evidence by ``gamma``, then add ``reward`` to branch ``i`` (in place).
    """
    if gamma != 1.0:
        disc_n *= gamma
        disc_sum *= gamma
    disc_n[i] += 1.0
    disc_sum[i] += reward


def discounted_ucb_scores(disc_n: ArrayLike, disc_sum: ArrayLike, pending: ArrayLike,
                          c: float) -> np.ndarray:
    """D-UCB scores (branch order); pending pulls count as undiscounted evidence, mean 0."""
    dn = np.asarray(disc_n, dtype=float)
    ds = np.asarray(disc_sum, dtype=float)
    n = dn + np.asarray(pending, dtype=float)
    log_total = log_pulls(None, n)
    mean = np.divide(ds, dn, out=np.zeros_like(dn), where=dn > 0)
    scores = mean + c * np.sqrt(log_total / np.where(n > 0, n, 1.0))
    scores[n <= 0] = math.inf
    return scores


class DiscountedUCBPolicy(Policy):
    """Discounted UCB (:mod:`.discounted`); keeps discounted counts and sums per branch."""

    name = "discounted-ucb"
    untried_first = True

    def __init__(self, c: float = 2 ** 0.5, gamma: float = 0.99):
        super().__init__()
        self.c = float(c)
        self.gamma = float(gamma)
        self.disc_n = np.zeros(16)
        self.disc_sum = np.zeros(16)

    def _fit(self, k: int) -> None:
        if k > len(self.disc_n):
            size = max(k, 2 * len(self.disc_n))
            self.disc_n = np.concatenate([self.disc_n, np.zeros(size - len(self.disc_n))])
            self.disc_sum = np.concatenate([self.disc_sum, np.zeros(size - len(self.disc_sum))])

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        return discounted_ucb_scores(self.disc_n[:k], self.disc_sum[:k], led.pending[:k],
                                     self.c)

    def on_result(self, led: LedgerView, i: int, h: Hypothesis, reward: float) -> None:
        self._fit(len(led.branches))
        discount_update(self.disc_n, self.disc_sum, i, reward, self.gamma)

    def params(self) -> dict[str, Any]:
        return {"c": self.c, "gamma": self.gamma}
