"""Selection and gating policies: pure functions of branch statistics, no Dask, no asyncio.

The driver (:mod:`.loop`) keeps per-branch statistics in numpy arrays and asks these
functions for scores and decisions; the functions never look at anything else, so they are
tested without a cluster and benchmarked alone.

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
>>> from dask_research.experiments.policies import ucb1_scores, select
>>> s = ucb1_scores(mean=[0.5, 0.9, 0.0], n=[2, 1, 0], c=2 ** 0.5)
>>> s.round(3).tolist()
[1.548, 2.382, inf]
>>> select(s, eligible=[True, True, False])
1
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "log_pulls",
    "ucb1_score",
    "ucb1_scores",
    "select",
    "prune_reason",
    "should_trigger_paper",
    "round_robin_scores",
    "greedy_scores",
    "prune_reason_vector",
    "should_trigger_paper_vector",
]

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


def select(scores: ArrayLike, eligible: ArrayLike) -> int | None:
    """Index of the highest score among eligible branches; ties go to the lowest index.

    Returns ``None`` when no branch is eligible.

    Examples
    --------
    >>> select([1.0, 3.0, 3.0], [True, True, True])
    1
    >>> select([1.0, 3.0], [False, False]) is None
    True
    """
    scores = np.asarray(scores, dtype=float)
    eligible = np.asarray(eligible, dtype=bool)
    masked = np.where(eligible, scores, -_INF)
    i = int(masked.argmax())      # argmax returns the first maximum: insertion order
    if eligible[i]:
        return i
    # every eligible score is -inf (or nothing is eligible): the first eligible, if any
    idx = np.flatnonzero(eligible)
    return int(idx[0]) if len(idx) else None


def prune_reason(
    runs: int,
    mean: float,
    failures: int,
    prune_after_runs: int,
    prune_floor: float,
    failure_limit: int | None,
) -> str | None:
    """Why a branch should be pruned now, or ``None``.

    ``"low-mean"``: at least ``prune_after_runs`` completed runs and a mean below
    ``prune_floor``. ``"failures"``: ``failure_limit`` failed experiments or more.

    Examples
    --------
    >>> prune_reason(3, 0.1, 0, prune_after_runs=3, prune_floor=0.2, failure_limit=3)
    'low-mean'
    >>> prune_reason(2, 0.1, 0, prune_after_runs=3, prune_floor=0.2, failure_limit=3) is None
    True
    """
    if failure_limit is not None and failures >= failure_limit:
        return "failures"
    if runs >= prune_after_runs and runs > 0 and mean < prune_floor:
        return "low-mean"
    return None


def should_trigger_paper(runs: int, mean: float, paper_threshold: float, emitted: bool) -> bool:
    """``True`` once: the first time a branch's mean exceeds ``paper_threshold``.

    >>> should_trigger_paper(1, 0.8, 0.7, emitted=False), should_trigger_paper(1, 0.8, 0.7, True)
    (True, False)
    """
    return (not emitted) and runs > 0 and mean > paper_threshold


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


def _worse(mean: float, bound: float, direction: str) -> bool:
    return mean < bound if direction == "max" else mean > bound


def _better(mean: float, bound: float, direction: str) -> bool:
    return mean > bound if direction == "max" else mean < bound


def prune_reason_vector(
    runs: int,
    means: dict[str, float],
    failures: int,
    prune_after_runs: int,
    floors: dict[str, float],
    directions: dict[str, str],
    failure_limit: int | None,
) -> str | None:
    """Per-objective pruning: ``"low-<objective>"`` once a floor is violated after
    ``prune_after_runs`` runs (below it for ``"max"`` objectives, above it for ``"min"``).

    A floor is a requirement, so violating any one of them prunes.

    >>> prune_reason_vector(3, {"acc": 0.1, "cost": 0.2}, 0, 3, {"acc": 0.3, "cost": 0.5},
    ...                     {"acc": "max", "cost": "min"}, None)
    'low-acc'
    >>> prune_reason_vector(3, {"acc": 0.5, "cost": 0.8}, 0, 3, {"acc": 0.3, "cost": 0.5},
    ...                     {"acc": "max", "cost": "min"}, None)
    'low-cost'
    """
    if failure_limit is not None and failures >= failure_limit:
        return "failures"
    if runs >= prune_after_runs and runs > 0:
        for name, floor in floors.items():
            if _worse(means[name], floor, directions[name]):
                return f"low-{name}"
    return None


def should_trigger_paper_vector(runs: int, means: dict[str, float], thresholds: dict[str, float],
                                directions: dict[str, str], emitted: bool) -> bool:
    """``True`` once: the first time a branch beats *every* per-objective threshold.

    >>> should_trigger_paper_vector(2, {"acc": 0.9, "cost": 0.1}, {"acc": 0.8, "cost": 0.2},
    ...                             {"acc": "max", "cost": "min"}, emitted=False)
    True
    """
    return (not emitted) and runs > 0 and all(
        _better(means[name], bound, directions[name]) for name, bound in thresholds.items())
