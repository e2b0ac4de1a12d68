"""Prototype max-bandit policies and proposers for ``bench_search.py`` (issue 17).

They live here, outside the package, while they are measured; the one that wins goes into
the package as a patch.

:class:`MaxUCBPolicy`
    MaxUCB (Balef, Vernade and Eggensperger, *Put CASH on Bandits: a max K-armed problem for
    automated machine learning*, NeurIPS 2025): the index of a branch is its best reward plus
    ``(alpha * ln N / n)^2``, rewards min-max scaled over everything seen; a bonus designed
    for the bounded, short-tailed, left-skewed rewards of a hyperparameter search (the
    square makes it decay like ``1/n^2``, much faster than Threshold Ascent's Chernoff
    bound, so a small budget is not spent exploring evenly).
:class:`UniqueOptunaSource`
    An :class:`~dask_research.experiments.OptunaSource` over a finite space that never
    proposes a configuration twice: a repeat the sampler asks for is told the known result
    at no cost and the sampler is asked again (a deterministic evaluation repeated is a
    wasted experiment).

Examples
--------
>>> import optuna
>>> from dask_research.experiments import Branch, IterationScheduler
>>> space = {"x": optuna.distributions.IntDistribution(0, 3)}
>>> src = UniqueOptunaSource(space, seed=0)
>>> sched = IterationScheduler(lambda h: h.payload["x"] / 3, slots=1, objective="max",
...                            policy=MaxUCBPolicy(), max_experiments=10, progress=False)
>>> sched.add([Branch("a", propose=src)])
>>> report = sched.run()
>>> sorted(r.hypothesis.payload["x"] for r in report.results), report.stop_reason
([0, 1, 2, 3], 'queue_empty')
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_research.experiments import OptunaSource
from dask_research.experiments.maxbandit import _MaxPolicy

if TYPE_CHECKING:
    from dask_research.experiments.ledger import BranchLedger
    from dask_research.experiments.types import Result

__all__ = ["MaxUCBPolicy", "RecentThresholdAscent", "RisingPolicy", "UniqueOptunaSource",
           "maxucb_index"]


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


class _SeqPolicy(_MaxPolicy):
    """Also keeps every branch's rewards in arrival order."""

    def __init__(self, bounded: bool = True) -> None:
        super().__init__(bounded)
        self.seq: list[list[float]] = []

    def on_result(self, led: BranchLedger, i: int, h: Any, reward: float) -> None:
        super().on_result(led, i, h, reward)
        while len(self.seq) <= i:
            self.seq.append([])
        self.seq[i].append(float(reward))

    def _fit(self, k: int) -> None:
        super()._fit(k)
        while len(self.seq) < k:
            self.seq.append([])


class RecentThresholdAscent(_SeqPolicy):
    """Threshold Ascent whose hit rate counts only a branch's last ``window`` results (a
    sliding window, Garivier and Moulines 2011): a branch whose proposer keeps improving keeps
    its rate, a branch whose proposer has plateaued loses it. ``distinct``: the threshold is
    the ``top``-th best distinct reward and a tie with the best is half a hit.

    >>> from dask_research.experiments import Hypothesis, Result
    >>> from dask_research.experiments.ledger import BranchLedger
    >>> led = BranchLedger(c=1.0, policy=RecentThresholdAscent(top=4, delta=10.0, window=3))
    >>> _ = led.add([Hypothesis(f"{b}{j}", b) for b in "ab" for j in range(6)])
    >>> for b, rs in (("a", [0.9, 0.9, 0.9, 0.1, 0.1, 0.1]), ("b", [0.5] * 5 + [0.92])):
    ...     for r in rs:
    ...         _ = led.record(Result(led.pop(led.branch_index(b)), r))
    >>> a, b = led.scores()      # a holds 3 of the top 4, but b the recent hit
    >>> bool(b > a)
    True
    """

    name = "recent-threshold-ascent"

    def __init__(self, top: int = 5, delta: float = 0.1, window: int = 6,
                 distinct: bool = False) -> None:
        super().__init__()
        self.top, self.delta, self.window = int(top), float(delta), int(window)
        self.distinct = bool(distinct)

    def scores(self, led: BranchLedger) -> np.ndarray:
        from dask_research.experiments.maxbandit import threshold_ascent_index

        k = len(led.branches)
        self._fit(k)
        allr = sorted((v for r in self.sorted for v in r), reverse=True)
        if self.distinct:
            allr = sorted(set(allr), reverse=True)
            t = allr[self.top - 1] if len(allr) >= self.top else -math.inf
            best = allr[0] if allr else math.inf
        else:
            t = allr[self.top - 1] if len(allr) >= self.top else -math.inf
        total = max(float(led.total_n), 1.0)
        alpha = max(0.0, math.log(2 * total * max(k, 1) / self.delta))
        out = np.empty(k)
        for i in range(k):
            recent = self.seq[i][-self.window:]
            if self.distinct:         # a tie with the best is half a hit
                hits = sum(1.0 if t <= v < best else 0.5 if v == best else 0.0
                           for v in recent)
            else:
                hits = sum(v >= t for v in recent)
            # half hits (ties with the best) are real counts; the bound is defined for them
            out[i] = threshold_ascent_index(hits, len(recent) + int(led.pending[i]),  # type: ignore[arg-type]
                                            alpha)
        return out

    def params(self) -> dict[str, Any]:
        return {"top": self.top, "delta": self.delta, "window": self.window}


class RisingPolicy(_SeqPolicy):
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
        n = [len(self.seq[i]) + int(led.pending[i]) for i in range(k)]
        if min(len(r) for r in self.seq[:k]) < self.window + 1:
            return np.array([-float(v) for v in n])
        best = [max(self.seq[i]) if self.seq[i] else -math.inf for i in range(k)]
        active = [i for i in range(k) if i not in self.dropped]
        left = max(self.budget - float(led.total_n), 0.0) / max(len(active), 1)
        for i in active:
            if len(active) - len(self.dropped & set(active)) < 2:
                break
            curve = np.maximum.accumulate(self.seq[i])
            slope = (curve[-1] - curve[-1 - self.window]) / self.window
            if best[i] + slope * left < max(best[j] for j in active
                                            if j != i and j not in self.dropped):
                self.dropped.add(i)
        return np.array([-math.inf if i in self.dropped else -float(n[i]) for i in range(k)])

    def params(self) -> dict[str, Any]:
        return {"budget": self.budget, "window": self.window}


def _grid(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every point of a finite space of Int (step 1) and Categorical distributions."""
    import optuna

    axes: list[list[tuple[str, Any]]] = []
    for name, d in space.items():
        if isinstance(d, optuna.distributions.IntDistribution):
            axes.append([(name, v) for v in range(d.low, d.high + 1, d.step)])
        elif isinstance(d, optuna.distributions.CategoricalDistribution):
            axes.append([(name, v) for v in d.choices])
        else:
            raise ValueError(f"{name}: a finite distribution is needed, not {d!r}")
    return [dict(p) for p in itertools.product(*axes)]


class UniqueOptunaSource(OptunaSource):
    """An :class:`OptunaSource` over a finite space that proposes each configuration once.

    A configuration the sampler asks for again is told its known result (or, when it is still
    in flight, failed) without an experiment, and the sampler is asked again, ``retries``
    times; then an unseen configuration is drawn uniformly. ``None`` once all are seen.
    """

    def __init__(self, space: Mapping[str, Any], *, seed: int = 0, retries: int = 20,
                 **kw: Any) -> None:
        super().__init__(space, seed=seed, **kw)
        self.grid = _grid(space)
        self.retries = int(retries)
        self.known: dict[tuple, float | None] = {}      # None: in flight
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def _key(params: Mapping[str, Any]) -> tuple:
        return tuple(sorted(params.items()))

    def propose(self, branch: str) -> Any:
        import optuna

        if len(self.known) >= len(self.grid):
            return None
        for _ in range(self.retries):
            h = super().propose(branch)
            if h is None:
                return None
            key = self._key(h.payload)
            if key not in self.known:
                self.known[key] = None
                return h
            trial = self._trials.pop(h.id)
            value = self.known[key]
            if value is None:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(trial, value)
        unseen = [p for p in self.grid if self._key(p) not in self.known]
        params = unseen[int(self.rng.integers(len(unseen)))]
        self.study.enqueue_trial(params)
        h = super().propose(branch)
        self.known[self._key(h.payload)] = None
        return h

    def observe(self, result: Result) -> None:
        if result.ok and isinstance(result.hypothesis.payload, Mapping):
            self.known[self._key(result.hypothesis.payload)] = float(result.reward)
        super().observe(result)
