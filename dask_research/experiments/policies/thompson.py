"""Thompson sampling (Thompson 1933; Agrawal and Goyal 2012), seeded and pending-aware.

One posterior draw per branch; the branch with the largest draw is picked.

- **Bounded rewards in [0, 1]**: ``Beta(1 + S_i, 1 + n_i - S_i)`` with ``S_i`` the reward sum
  of completed runs and ``n_i = runs + pending``: an experiment in flight counts as a pull that
  paid 0 (the pessimistic "constant liar"), so parallel slots spread out. For 0/1 rewards this
  is the Beta-Bernoulli posterior; fractional rewards enter as fractional successes. An
  untried branch draws from Beta(1, 1), so it is not forced first.
- **Unbounded rewards**: ``Normal(mean_i, s^2 / n_i)`` with ``s`` the branch's sample standard
  deviation (the pooled one across branches while a branch has fewer than 2 runs, 1 if none),
  mean 0 while a branch has only pending pulls; untried branches draw ``+inf``.

The draws come from the ``numpy.random.Generator`` you pass: the same seed and the same history
give the same picks. Pure numpy, no Dask.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies.thompson import thompson_scores
>>> rng = np.random.default_rng(0)
>>> s = thompson_scores([9.0, 1.0, 0.0], runs=[10, 10, 0], n=[10, 10, 0], rng=rng)
>>> bool(0.0 <= s.min() and s.max() <= 1.0)    # untried branches draw from Beta(1, 1)
True
>>> again = thompson_scores([9.0, 1.0, 0.0], [10, 10, 0], [10, 10, 0],
...                         rng=np.random.default_rng(0))
>>> bool((again[:2] == s[:2]).all())
True
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .base import LedgerView, Policy

__all__ = ["ThompsonPolicy", "thompson_scores"]


def thompson_scores(reward_sum: ArrayLike, runs: ArrayLike, n: ArrayLike,
                    rng: np.random.Generator, bounded: bool = True,
                    sq_sum: ArrayLike | None = None) -> np.ndarray:
    """One posterior draw per branch (branch order).

    Parameters
    ----------
    reward_sum : array of float
        Sum of rewards of completed runs.
    runs : array of int
        Completed runs.
    n : array of int or float
        ``runs + pending``.
    rng : numpy.random.Generator
        Source of the draws (seed it for reproducible picks).
    bounded : bool
        Rewards in [0, 1] (Beta posterior) or not (Gaussian).
    sq_sum : array of float, optional
        Sum of squared rewards (Gaussian case: the variance); without it ``s = 1``.
    """
    s_ = np.asarray(reward_sum, dtype=float)
    runs_ = np.asarray(runs, dtype=float)
    n_ = np.asarray(n, dtype=float)
    if bounded:
        a = 1.0 + np.clip(s_, 0.0, None)
        b = 1.0 + np.maximum(n_ - s_, 0.0)
        return rng.beta(a, b)
    mean = np.divide(s_, runs_, out=np.zeros_like(s_), where=runs_ > 0)
    if sq_sum is None:
        sd = np.ones_like(s_)
    else:
        sq = np.asarray(sq_sum, dtype=float)
        var = np.divide(sq - runs_ * mean * mean, runs_ - 1, out=np.zeros_like(s_),
                        where=runs_ > 1)
        enough = runs_ > 1
        tot = runs_[enough].sum()
        pooled = (float((var[enough] * (runs_[enough] - 1)).sum() / max(tot - enough.sum(), 1))
                  if enough.any() else 1.0)
        sd = np.sqrt(np.where(enough, np.maximum(var, 0.0), max(pooled, 1e-12)))
    draws = rng.normal(mean, sd / np.sqrt(np.maximum(n_, 1.0)))
    draws[n_ == 0] = math.inf
    return draws


class ThompsonPolicy(Policy):
    """Seeded Thompson sampling (:func:`.thompson.thompson_scores`).

    ``bounded=True``: the Beta posterior of [0, 1] rewards; ``bounded=False`` (the policy
    ``"thompson-gaussian"``): a Gaussian posterior on each branch's sample variance, also for
    [0, 1] rewards, which suits continuous rewards with little noise.
    """

    name = "thompson"

    def __init__(self, seed: int = 0, bounded: bool = True):
        super().__init__()
        self.seed = int(seed)
        self.bounded = bool(bounded)
        if not self.bounded:
            self.name = "thompson-gaussian"
        self.rng = self._rng = np.random.default_rng(self.seed)

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        return thompson_scores(led.reward_sum[:k], led.runs[:k], led.n[:k], self._rng,
                               self.bounded, led.sq_sum[:k])

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed, "bounded": self.bounded}
