"""Max-bandit ("best-of-branch") policies and gates: pure functions and two Policy classes.

With ``objective="max"`` the scheduler looks for the branch most likely to produce the *best*
single result, not the best average (a hyperparameter search keeps only its best
configuration; one catastrophic configuration must not bury a model family). Two rules from
the max-bandit literature are implemented; ``research.experiments.max-policy`` picks one:

``"threshold-ascent"`` (default, chosen by measurement in ``benchmarks/bench_search.py``)
    Threshold Ascent (Streeter and Smith, CP 2006): keep a threshold ``T`` at the ``s``-th best
    reward seen overall and pick the branch with the highest Chernoff upper bound on the
    probability of beating it, ``U(p, n) = p + (a + sqrt(2 n p a + a^2)) / n`` with
    ``p = hits / n`` and ``a = ln(2 N K / delta)``. With ``window=w`` the hit rate counts only
    a branch's last ``w`` results (a sliding window, Garivier and Moulines, ALT 2011): a
    branch whose sampler keeps climbing keeps its rate, one whose sampler has plateaued loses
    it (``benchmarks/bench_search.py``: ``top=3, delta=10, window=6``).
``"quantile-ucb"``
    An upper confidence bound on each branch's ``tau``-quantile, after the quantile bandits of
    Szörényi, Busa-Fekete, Weng and Hüllermeier (ICML 2015): with ``n_i`` pulls the bound is
    the empirical quantile at level ``tau + eps_i``, ``eps_i = c * sqrt(ln N / (2 n_i))``
    (a Dvoretzky-Kiefer-Wolfowitz width that grows with the total ``N`` like UCB1). Where the
    level exceeds 1 the sample cannot bound the quantile: the index is then the top of the
    reward range plus the excess level, so less-tried branches go first. A quantile is robust
    to outliers on both sides: a branch with one catastrophic draw keeps its index.

Experiments in flight count as draws at the bottom of the reward range (the constant liar of
the mean policies), so parallel slots do not all pile onto one branch.

Pruning for ``"max"`` (:func:`max_prune_reason`): a branch is pruned once its upper bound on
the ``tau``-quantile (the quantile-UCB bound above) falls below the best reward seen in *another*
branch, i.e. once it is unlikely to produce a new best; never because of low means, and never
the branch holding the best result.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies import quantile_ucb_index, threshold_ascent_index
>>> round(quantile_ucb_index([0.1, 0.5, 0.9, 0.95], pending=0, total=40, tau=0.5, c=0.3), 3)
0.9
>>> quantile_ucb_index([], pending=0, total=4, tau=0.5, c=0.3)
inf
>>> round(threshold_ascent_index(hits=2, n=10, alpha=1.0), 3)
0.524
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...exceptions import InputError
from ..types import Hypothesis
from .base import LedgerView, Policy

__all__ = [
    "MAX_POLICY_NAMES",
    "quantile_ucb_index",
    "threshold_ascent_index",
    "max_prune_reason",
    "should_trigger_paper_max",
    "QuantileUCBPolicy",
    "ThresholdAscentPolicy",
    "make_max_policy",
]

MAX_POLICY_NAMES = ("threshold-ascent", "quantile-ucb")


def quantile_ucb_index(rewards: Sequence[float], pending: int, total: float, tau: float,
                       c: float, low: float = 0.0, high: float = 1.0) -> float:
    """Upper confidence bound on one branch's ``tau``-quantile.

    Parameters
    ----------
    rewards : sequence of float
        The branch's rewards, **sorted ascending**.
    pending : int
        Experiments in flight; they count as draws at ``low``.
    total : float
        Pulls (results and in flight) over all branches, ``N``.
    tau : float
        Quantile level in (0, 1).
    c : float
        Width of the confidence level: ``eps = c * sqrt(ln N / (2 n))``.
    low, high : float
        Bottom and top of the reward range (``high`` may be ``max(reward seen)`` for
        unbounded rewards).

    Returns
    -------
    float
        ``+inf`` for an untried branch; above ``high`` when the level ``tau + eps`` exceeds 1.

    Examples
    --------
    >>> quantile_ucb_index([0.2, 0.4], pending=1, total=3, tau=0.5, c=0.0)   # 0, 0.2, 0.4
    0.2
    """
    n = len(rewards) + pending
    if n == 0:
        return math.inf
    eps = c * math.sqrt(math.log(total) / (2 * n)) if total > 1 else 0.0
    level = tau + eps
    if level >= 1.0:
        return high + (level - 1.0)
    rank = max(1, math.ceil(level * n))          # 1-based order statistic of n draws
    if rank <= pending:
        return low
    return float(rewards[rank - pending - 1])


def threshold_ascent_index(hits: int, n: int, alpha: float) -> float:
    """Threshold Ascent's Chernoff bound ``U(hits / n, n)`` (``+inf`` when ``n == 0``).

    >>> threshold_ascent_index(0, 0, 1.0)
    inf
    >>> threshold_ascent_index(0, 4, 1.0)
    0.5
    """
    if n == 0:
        return math.inf
    p = hits / n
    return p + (alpha + math.sqrt(2 * n * p * alpha + alpha * alpha)) / n


def max_prune_reason(i: int, rewards: Sequence[float], best_seen: float, holder: int | None,
                     runs: int, failures: int, total: float, tau: float, c: float,
                     prune_after_runs: int, failure_limit: int | None,
                     high: float = 1.0) -> str | None:
    """Why branch ``i`` should be pruned under ``objective="max"``, or ``None``.

    ``"failures"`` as for the mean; ``"no-better-best"`` once the branch has
    ``prune_after_runs`` results and its quantile-UCB bound (``pending=0``) is below
    ``best_seen``, the best reward of the branch ``holder`` (which is never pruned).

    Examples
    --------
    >>> max_prune_reason(1, [0.1] * 30, 0.9, 0, 30, 0, 200, tau=0.75, c=0.5,
    ...                  prune_after_runs=3, failure_limit=None)
    'no-better-best'
    >>> max_prune_reason(1, [0.1, 0.1, 0.1], 0.9, 0, 3, 0, 20, tau=0.75, c=0.5,
    ...                  prune_after_runs=3, failure_limit=None) is None
    True
    """
    if failure_limit is not None and failures >= failure_limit:
        return "failures"
    if holder is None or holder == i or runs < prune_after_runs or runs == 0:
        return None
    bound = quantile_ucb_index(rewards, 0, total, tau, c, high=high)
    return "no-better-best" if bound < best_seen else None


def should_trigger_paper_max(best: float, best_seen: float, threshold: float,
                             emitted: bool) -> bool:
    """``True`` once per branch: when its result is the best so far *and* above ``threshold``
    (so the paper stage follows record results, not every branch that clears the bar).

    >>> should_trigger_paper_max(0.95, 0.95, 0.9, False), should_trigger_paper_max(0.92, 0.95,
    ...                                                                          0.9, False)
    (True, False)
    """
    return (not emitted) and best >= best_seen and best > threshold


class _MaxPolicy(Policy):
    """Keeps every branch's rewards sorted (the state of the max-bandit rules)."""

    objective = "max"
    untried_first = True

    def __init__(self, bounded: bool = True) -> None:
        super().__init__()
        self.bounded = bool(bounded)
        self.sorted: list[list[float]] = []
        self.recent: list[list[float]] = []       # arrival order

    def _fit(self, k: int) -> None:
        while len(self.sorted) < k:
            self.sorted.append([])
            self.recent.append([])

    def on_result(self, led: LedgerView, i: int, h: Hypothesis, reward: float) -> None:
        self._fit(i + 1)
        bisect.insort(self.sorted[i], float(reward))
        self.recent[i].append(float(reward))

    def range(self, led: LedgerView) -> tuple[float, float]:
        """``(low, high)`` of the reward range: [0, 1], or what was seen (unbounded)."""
        if self.bounded:
            return 0.0, 1.0
        seen = [v for r in self.sorted if r for v in (r[0], r[-1])]
        return (min(seen), max(seen)) if seen else (0.0, 1.0)


class QuantileUCBPolicy(_MaxPolicy):
    """Quantile UCB (:func:`quantile_ucb_index`) over each branch's rewards."""

    name = "quantile-ucb"

    def __init__(self, tau: float = 0.8, c: float = 0.5, bounded: bool = True) -> None:
        super().__init__(bounded)
        self.tau = float(tau)
        self.c = float(c)

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        low, high = self.range(led)
        total = float(led.total_n)
        return np.array([quantile_ucb_index(self.sorted[i], int(led.pending[i]), total,
                                            self.tau, self.c, low, high) for i in range(k)])

    def params(self) -> dict[str, Any]:
        return {"tau": self.tau, "c": self.c}


class ThresholdAscentPolicy(_MaxPolicy):
    """Threshold Ascent (:func:`threshold_ascent_index`); ``top`` is the paper's ``s``;
    ``window``: count hits over each branch's last ``window`` results only (``None``: all).

    >>> ThresholdAscentPolicy(top=3, delta=10.0, window=6)
    ThresholdAscentPolicy(top=3, delta=10, window=6)
    """

    name = "threshold-ascent"

    def __init__(self, top: int = 5, delta: float = 0.1, bounded: bool = True,
                 window: int | None = None) -> None:
        super().__init__(bounded)
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InputError("top", top, "an integer >= 1 (Threshold Ascent's s)",
                             where="ThresholdAscentPolicy")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (
                math.isfinite(delta) and delta > 0):
            raise InputError("delta", delta, "a finite number > 0", where="ThresholdAscentPolicy")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise InputError("window", window, "an integer >= 1 or None",
                             where="ThresholdAscentPolicy")
        self.top = int(top)
        self.delta = float(delta)
        self.window = window

    def threshold(self) -> float:
        """The ``top``-th best reward seen (``-inf`` before ``top`` results)."""
        allr = sorted((v for r in self.sorted for v in r), reverse=True)
        return allr[self.top - 1] if len(allr) >= self.top else -math.inf

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        t = self.threshold()
        total = max(float(led.total_n), 1.0)
        # the paper's delta is a failure probability in (0, 1); a larger delta (less
        # exploration, for small budgets) is allowed, and alpha stays >= 0
        alpha = max(0.0, math.log(2 * total * max(k, 1) / self.delta))
        out = np.empty(k)
        for i in range(k):
            if self.window is not None:
                r = self.recent[i][-self.window:]
                hits = sum(v >= t for v in r)
            else:
                r = self.sorted[i]
                hits = len(r) - bisect.bisect_left(r, t) if t > -math.inf else len(r)
            out[i] = threshold_ascent_index(hits, len(r) + int(led.pending[i]), alpha)
        return out

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"top": self.top, "delta": self.delta}
        if self.window is not None:
            out["window"] = self.window
        return out


def make_max_policy(name: str, *, tau: float, c: float, top: int = 5, delta: float = 0.1,
                    bounded: bool = True) -> Policy:
    """The max-bandit :class:`~.base.Policy` called ``name`` (:data:`MAX_POLICY_NAMES`).

    >>> make_max_policy("quantile-ucb", tau=0.8, c=0.5)
    QuantileUCBPolicy(tau=0.8, c=0.5)
    """
    if name == "quantile-ucb":
        return QuantileUCBPolicy(tau, c, bounded)
    if name == "threshold-ascent":
        return ThresholdAscentPolicy(top, delta, bounded)
    raise InputError("max_policy", name, "one of " + ", ".join(map(repr, MAX_POLICY_NAMES)),
                     where="IterationScheduler(objective='max')")
