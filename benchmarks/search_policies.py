"""Max-bandit policies tried and rejected in the search study of ``bench_search.py`` (issue 17).

The study's pick landed in the package: :class:`~dask_research.experiments.policies.maxbandit.\
ThresholdAscentPolicy` with ``window=6`` (top 3, delta 10) over
:class:`~dask_research.experiments.OptunaSource` with ``unique=True``. What stays here are the
alternatives ``search_tune.py`` measured against it, kept to record what was tried:

:class:`MaxUCBPolicy`
    MaxUCB (Balef, Vernade and Eggensperger, *Put CASH on Bandits: a max K-armed problem for
    automated machine learning*, NeurIPS 2025): the index of a branch is its best reward plus
    ``(alpha * ln N / n)^2``, rewards min-max scaled over everything seen; a bonus designed
    for the bounded, short-tailed, left-skewed rewards of a hyperparameter search (the
    square makes it decay like ``1/n^2``, much faster than Threshold Ascent's Chernoff
    bound, so a small budget is not spent exploring evenly).
:class:`RisingPolicy`
    Rising bandits (Li et al., AAAI 2020).
:class:`DistinctThresholdAscent`
    Windowed Threshold Ascent whose threshold is the ``top``-th best *distinct* reward, a tie
    with the best counting half a hit.

Examples
--------
>>> import optuna
>>> from dask_research.experiments import Branch, IterationScheduler, OptunaSource
>>> space = {"x": optuna.distributions.IntDistribution(0, 3)}
>>> src = OptunaSource(space, seed=0, unique=True)
>>> sched = IterationScheduler(lambda h: h.payload["x"] / 3, slots=1, objective="max",
...                            policy=MaxUCBPolicy(), max_experiments=10, progress=False)
>>> sched.add([Branch("a", propose=src)])
>>> report = sched.run()
>>> sorted(r.hypothesis.payload["x"] for r in report.results), report.stop_reason
([0, 1, 2, 3], 'queue_empty')
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_research.experiments.policies.maxbandit import (
    ThresholdAscentPolicy,
    _MaxPolicy,
    threshold_ascent_index,
)

if TYPE_CHECKING:
    from dask_research.experiments.ledger import BranchLedger

__all__ = ["DistinctThresholdAscent", "MaxUCBPolicy", "RisingPolicy", "maxucb_index"]


def maxucb_index(best: float, n: int, total: float, alpha: float) -> float:
    """MaxUCB's index ``best + (alpha * ln(total) / n)^2`` (``+inf`` when ``n == 0``).

    >>> round(maxucb_index(0.9, 4, 20, 0.5), 4)
    1.0402
    """
    if n == 0:
        return math.inf
    return best + (alpha * math.log(max(total, 1.0)) / n) ** 2


class MaxUCBPolicy(_MaxPolicy):
    """MaxUCB over min-max scaled rewards; experiments in flight count in ``n``.

    ``low``/``high`` of the scaling are the extremes seen over all branches, mapped to
    ``[0.01, 0.99]`` as in the paper's code.

    >>> MaxUCBPolicy(alpha=0.5)
    MaxUCBPolicy(alpha=0.5)
    """

    name = "max-ucb"

    def __init__(self, alpha: float = 0.5) -> None:
        super().__init__(bounded=False)
        self.alpha = float(alpha)

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        seen = [v for r in self.sorted if r for v in (r[0], r[-1])]
        low, high = (min(seen), max(seen)) if seen else (0.0, 1.0)
        span = (high - low) or 1.0
        total = float(led.total_n)
        out = np.empty(k)
        for i in range(k):
            r = self.sorted[i]
            n = len(r) + int(led.pending[i])
            best = 0.01 + 0.98 * (r[-1] - low) / span if r else 0.0
            out[i] = maxucb_index(best, n, total, self.alpha) if r else math.inf
        return out

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}


class RisingPolicy(_MaxPolicy):
    """Rising bandits (Li et al., *Efficient automatic CASH via rising bandits*, AAAI 2020):
    a branch's best-so-far curve is extrapolated by its slope over the last ``window`` results
    to the end of the budget (its share of the rest); a branch whose upper bound falls below
    another's best is dropped; the others run round-robin (fewest pulls first).

    >>> RisingPolicy(budget=60, window=5)
    RisingPolicy(budget=60, window=5)
    """

    name = "rising"

    def __init__(self, budget: int, window: int = 5) -> None:
        super().__init__()
        self.budget, self.window = int(budget), int(window)
        self.dropped: set[int] = set()

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        n = [len(self.recent[i]) + int(led.pending[i]) for i in range(k)]
        if min(len(r) for r in self.recent[:k]) < self.window + 1:
            return np.array([-float(v) for v in n])
        best = [max(self.recent[i]) if self.recent[i] else -math.inf for i in range(k)]
        active = [i for i in range(k) if i not in self.dropped]
        left = max(self.budget - float(led.total_n), 0.0) / max(len(active), 1)
        for i in active:
            if len(active) - len(self.dropped & set(active)) < 2:
                break
            curve = np.maximum.accumulate(self.recent[i])
            slope = (curve[-1] - curve[-1 - self.window]) / self.window
            if best[i] + slope * left < max(best[j] for j in active
                                            if j != i and j not in self.dropped):
                self.dropped.add(i)
        return np.array([-math.inf if i in self.dropped else -float(n[i]) for i in range(k)])

    def params(self) -> dict[str, Any]:
        return {"budget": self.budget, "window": self.window}



class DistinctThresholdAscent(ThresholdAscentPolicy):
    """Windowed Threshold Ascent (``window`` required) whose threshold is the ``top``-th best
    distinct reward, a tie with the best counting half a hit (rejected: ``search_tune.py``'s
    ``rta-distinct-*`` candidates).

    >>> from dask_research.experiments import Hypothesis, Result
    >>> from dask_research.experiments.ledger import BranchLedger
    >>> led = BranchLedger(c=1.0, policy=DistinctThresholdAscent(top=2, delta=10.0, window=3))
    >>> _ = led.add([Hypothesis(f"{b}{j}", b) for b in "ab" for j in range(3)])
    >>> for b, rs in (("a", [0.9, 0.1, 0.1]), ("b", [0.5, 0.5, 0.8])):
    ...     for r in rs:
    ...         _ = led.record(Result(led.pop(led.branch_index(b)), r))
    >>> a, b = led.scores()      # a's tie with the best is half a hit, b's 0.8 a whole one
    >>> bool(b > a)
    True
    """

    name = "distinct-threshold-ascent"

    def __init__(self, top: int = 5, delta: float = 0.1, window: int = 6) -> None:
        super().__init__(top, delta, window=window)

    def scores(self, led: BranchLedger) -> np.ndarray:  # type: ignore[override]
        k = len(led.branches)
        self._fit(k)
        allr = sorted({v for r in self.sorted for v in r}, reverse=True)
        t = allr[self.top - 1] if len(allr) >= self.top else -math.inf
        best = allr[0] if allr else math.inf
        total = max(float(led.total_n), 1.0)
        alpha = max(0.0, math.log(2 * total * max(k, 1) / self.delta))
        out = np.empty(k)
        for i in range(k):
            recent = self.recent[i][-self.window:]
            hits = sum(1.0 if t <= v < best else 0.5 if v == best else 0.0 for v in recent)
            # half hits (ties with the best) are real counts; the bound is defined for them
            out[i] = threshold_ascent_index(hits, len(recent) + int(led.pending[i]),  # type: ignore[arg-type]
                                            alpha)
        return out

    def params(self) -> dict[str, Any]:
        return {**super().params(), "distinct": True}
