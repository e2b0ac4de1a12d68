"""Hypothesis strategies for the experiment scheduler: branch statistics, hypotheses, rewards.

:func:`branch_stats` draws *consistent* per-branch statistics (the sums really are sums of
drawn rewards), the input every index policy is a pure function of; :func:`hypotheses` draws
unique-id hypothesis lists (optionally with feature vectors); :func:`reward_vectors` draws
vector rewards for declared objectives.

Examples
--------
>>> import math
>>> from hypothesis import given
>>> from dask_research.testing.experiments import branch_stats
>>> from dask_research.experiments.policies import ucb1_scores
>>> @given(branch_stats())
... def test_untried_is_inf(s):
...     scores = ucb1_scores(s.mean, s.n, c=1.0)
...     assert all(math.isinf(x) for x, n in zip(scores, s.n) if n == 0)
>>> test_untried_is_inf()
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from ..experiments.types import Hypothesis

__all__ = ["BranchArrays", "branch_stats", "hypotheses", "reward_vectors", "rewards", "resume_quietly"]


@dataclass
class BranchArrays:
    """Per-branch arrays in branch order, as :class:`~dask_research.experiments.BranchLedger`
    keeps them: ``mean`` is 0 where ``runs == 0``; ``n = runs + pending``."""

    mean: np.ndarray
    runs: np.ndarray
    pending: np.ndarray
    reward_sum: np.ndarray
    sq_sum: np.ndarray
    eligible: np.ndarray

    @property
    def n(self) -> np.ndarray:
        return (self.runs + self.pending).astype(float)

    @property
    def k(self) -> int:
        return len(self.mean)


def rewards(bounded: bool = True) -> st.SearchStrategy[float]:
    """One scalar reward: in [0, 1] (with 0/1 over-represented) or any moderate float."""
    if bounded:
        return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))
    return st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def branch_stats(draw: st.DrawFn, min_branches: int = 1, max_branches: int = 25,
                 max_runs: int = 20, max_pending: int = 3,
                 bounded: bool = True) -> BranchArrays:
    """Consistent statistics of ``min_branches..max_branches`` branches."""
    k = draw(st.integers(min_branches, max_branches))
    mean, runs, pending, sums, sqs, eligible = [], [], [], [], [], []
    for _ in range(k):
        rs = draw(st.lists(rewards(bounded), max_size=max_runs))
        s = float(np.sum(rs)) if rs else 0.0
        runs.append(len(rs))
        sums.append(s)
        sqs.append(float(np.sum(np.square(rs))) if rs else 0.0)
        mean.append(s / len(rs) if rs else 0.0)
        pending.append(draw(st.integers(0, max_pending)))
        eligible.append(draw(st.booleans()))
    return BranchArrays(np.array(mean, float), np.array(runs, np.int64),
                        np.array(pending, np.int64), np.array(sums, float),
                        np.array(sqs, float), np.array(eligible, bool))


@st.composite
def hypotheses(draw: st.DrawFn, branches: int = 4, min_size: int = 1, max_size: int = 30,
               features: int | None = None) -> list[Hypothesis]:
    """Unique-id hypotheses over ``b0..b<branches-1>``; with ``features=d`` each carries a
    feature vector of ``d`` floats in [-1, 1]."""
    n = draw(st.integers(min_size, max_size))
    out = []
    for j in range(n):
        b = draw(st.integers(0, branches - 1))
        f = None
        if features:
            f = tuple(draw(st.lists(st.floats(-1, 1), min_size=features, max_size=features)))
        out.append(Hypothesis(f"h{j}", f"b{b}", {"j": j}, f))
    return out


def reward_vectors(dims: int, bounded: bool = True) -> st.SearchStrategy[tuple[float, ...]]:
    """Vector rewards of ``dims`` objectives."""
    return st.tuples(*[rewards(bounded) for _ in range(dims)])


def resume_quietly(path, **kw):
    """:meth:`IterationScheduler.resume` of the journal at ``path`` without the
    :class:`~dask_research.experiments.lock.JournalLockWarning` a test's own earlier scheduler
    (still alive in this process, as after a simulated crash) makes it give."""
    import warnings

    from ..experiments import IterationScheduler
    from ..experiments.lock import JournalLockWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JournalLockWarning)
        return IterationScheduler.resume(path, **kw)
