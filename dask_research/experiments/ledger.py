"""Per-branch bookkeeping in numpy arrays: queues, counts, means, gates.

:class:`BranchLedger` is the scheduler's state without any I/O: no asyncio, no Dask, no
clocks. It owns the per-branch arrays the policy reads (so a decision over 1,000 branches is a
handful of vectorised numpy operations, not a Python loop) and the FIFO queue of hypotheses of
each branch. The driver in :mod:`.loop` calls ``select``/``pop``/``record``; tests drive it
directly and compare it with a plain-Python model.

Examples
--------
>>> from dask_research.experiments import Hypothesis, Result
>>> from dask_research.experiments.ledger import BranchLedger
>>> led = BranchLedger(c=1.0)
>>> led.add([Hypothesis("a1", "a"), Hypothesis("b1", "b"), Hypothesis("a2", "a")])
[]
>>> i, scores = led.select()
>>> led.branches[i], scores.tolist()
('a', [inf, inf])
>>> h = led.pop(i)
>>> led.stats(led.record(Result(h, 0.5))).runs
1
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from ..exceptions import ExperimentError
from . import policies
from .types import BranchStats, Hypothesis, Result

__all__ = ["BranchLedger"]

ScoreFn = Callable[[np.ndarray, np.ndarray, float, float], np.ndarray]


def _ucb1(mean: np.ndarray, n: np.ndarray, c: float, total: float) -> np.ndarray:
    return policies.ucb1_scores(mean, n, c, total)


class BranchLedger:
    """Queues and statistics of every branch, in insertion order.

    Parameters
    ----------
    c : float
        UCB1 exploration constant.
    policy : callable, optional
        ``policy(mean, n, c, total) -> scores`` (numpy arrays in branch order); default
        :func:`.policies.ucb1_scores`.
    """

    def __init__(self, c: float, policy: ScoreFn | None = None, capacity: int = 16):
        self.c = float(c)
        self.policy: ScoreFn = policy or _ucb1
        self._fast = policy is None
        self.branches: list[str] = []
        self.index: dict[str, int] = {}
        self.queues: list[deque[Hypothesis]] = []
        self.ids: set[str] = set()
        self.total_n = 0          # sum of runs + pending over all branches
        self.total_runs = 0
        self.n_queued = 0         # sum of queued over all branches
        self._alloc(capacity)

    # -- storage ------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        k = len(self.branches)

        def grow(name: str, dtype: type) -> np.ndarray:
            new = np.zeros(capacity, dtype=dtype)
            old = getattr(self, name, None)
            if old is not None:
                new[:k] = old[:k]
            return new

        self.runs = grow("runs", np.int64)
        self.pending = grow("pending", np.int64)
        self.n = grow("n", np.float64)            # runs + pending, float for the policy
        self.inv_n = grow("inv_n", np.float64)    # 1 / n, +inf where n == 0 (UCB1 fast path)
        self.reward_sum = grow("reward_sum", np.float64)
        self.mean = grow("mean", np.float64)      # 0 until the first result
        self.queued = grow("queued", np.int64)
        self.failures = grow("failures", np.int64)
        self.eligible = grow("eligible", np.bool_)  # queued > 0 and not pruned
        self.pruned = grow("pruned", np.bool_)
        self.paper = grow("paper", np.bool_)
        self.prune_reasons: dict[int, str] = getattr(self, "prune_reasons", {})

    def _branch(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = len(self.branches)
            if i == len(self.runs):
                self._alloc(2 * len(self.runs))
            self.branches.append(name)
            self.index[name] = i
            self.inv_n[i] = math.inf
            self.queues.append(deque())
        return i

    def branch_index(self, name: str) -> int:
        """Index of a known branch; :class:`ExperimentError` naming the known ones otherwise."""
        try:
            return self.index[name]
        except KeyError:
            known = ", ".join(repr(b) for b in self.branches[:10])
            more = f" and {len(self.branches) - 10} more" if len(self.branches) > 10 else ""
            raise ExperimentError(
                f"unknown branch {name!r} in a result; known branches: {known or 'none'}{more}",
                branch=name,
            ) from None

    # -- queue --------------------------------------------------------------------------
    @staticmethod
    def check(hypotheses: Iterable[Hypothesis], seen: set[str]) -> list[Hypothesis]:
        """Validate a batch against ``seen`` ids; returns it as a list."""
        batch = list(hypotheses)
        new: set[str] = set()
        for h in batch:
            if not isinstance(h, Hypothesis):
                raise ExperimentError(
                    f"expected Hypothesis objects, got {type(h).__name__} {h!r}; "
                    "wrap it: Hypothesis(id='h1', branch='b', payload=...)",
                    value=h,
                )
            if not isinstance(h.id, str) or not isinstance(h.branch, str):
                raise ExperimentError(
                    f"Hypothesis id and branch must be strings, got id={h.id!r}, "
                    f"branch={h.branch!r}",
                    value=h,
                )
            if h.id in seen or h.id in new:
                raise ExperimentError(
                    f"duplicate hypothesis id {h.id!r} (branch {h.branch!r}); "
                    "ids must be unique over the whole run",
                    id=h.id,
                )
            new.add(h.id)
        return batch

    def add(self, hypotheses: Iterable[Hypothesis]) -> list[Hypothesis]:
        """Queue hypotheses (all or none). Returns those dropped because their branch is pruned."""
        batch = self.check(hypotheses, self.ids)
        dropped = []
        for h in batch:
            self.ids.add(h.id)
            i = self._branch(h.branch)
            if self.pruned[i]:
                dropped.append(h)
                continue
            self.queues[i].append(h)
            self.queued[i] += 1
            self.n_queued += 1
            self.eligible[i] = True
        return dropped

    # -- decisions ----------------------------------------------------------------------
    def scores(self) -> np.ndarray:
        """Current policy score of every branch (branch order)."""
        k = len(self.branches)
        total = self.total_n
        if self._fast and total > 1 and self.c > 0:
            # UCB1 from the maintained 1/n: three vectorised operations; +inf stays +inf where
            # n == 0 (equal to policies.ucb1_scores, which the tests check against a model)
            scores = self.inv_n[:k] * (self.c * self.c * math.log(total))
            np.sqrt(scores, out=scores)
            scores += self.mean[:k]
            return scores
        scores = np.array(self.policy(self.mean[:k], self.n[:k], self.c, float(total)),
                          dtype=float)      # a copy: select events keep it
        if scores.shape != (k,):
            raise ExperimentError(
                f"policy returned scores of shape {scores.shape}; expected one score per "
                f"branch, shape ({k},)", shape=scores.shape)
        return scores

    def has_work(self) -> bool:
        """Whether any unpruned branch has queued hypotheses."""
        return self.n_queued > 0

    def select(self) -> tuple[int, np.ndarray] | None:
        """``(branch index, scores)`` of the next pick, or ``None`` when nothing is eligible."""
        if self.n_queued == 0:
            return None
        k = len(self.branches)
        scores = self.scores()
        eligible = self.eligible[:k]
        i = int(np.where(eligible, scores, -math.inf).argmax())   # first maximum: ties
        if not eligible[i]:                                        # go to insertion order
            j = policies.select(scores, eligible)
            return None if j is None else (j, scores)
        return i, scores

    def pop(self, i: int) -> Hypothesis:
        """Take the oldest queued hypothesis of branch ``i``; it counts as pending."""
        h = self.queues[i].popleft()
        self.queued[i] -= 1
        self.n_queued -= 1
        if self.queued[i] == 0:
            self.eligible[i] = False
        self.pending[i] += 1
        self._count(i, 1.0)
        self.total_n += 1
        return h

    def _count(self, i: int, delta: float) -> None:
        n = float(self.n[i]) + delta
        self.n[i] = n
        self.inv_n[i] = 1.0 / n if n > 0 else math.inf

    def _settle(self, h: Hypothesis) -> int:
        i = self.branch_index(h.branch)
        if self.pending[i] <= 0:
            raise ExperimentError(
                f"result for {h.id!r} on branch {h.branch!r} arrived, but that branch has "
                "nothing in flight; results must come from dispatched hypotheses",
                id=h.id,
            )
        self.pending[i] -= 1
        self._count(i, -1.0)
        self.total_n -= 1
        return i

    def record(self, result: Result) -> int:
        """Count a successful result; returns the branch index (see :meth:`stats`)."""
        i = self._settle(result.hypothesis)
        self.runs[i] += 1
        self._count(i, 1.0)
        self.total_n += 1
        self.total_runs += 1
        self.reward_sum[i] += result.reward
        self.mean[i] = self.reward_sum[i] / self.runs[i]
        return i

    def record_failure(self, h: Hypothesis) -> int:
        """Count a failed experiment (no reward; it frees its pending pull); returns the index."""
        i = self._settle(h)
        self.failures[i] += 1
        return i

    def prune(self, i: int, reason: str) -> list[Hypothesis]:
        """Exclude branch ``i`` from scheduling; returns its dropped queued hypotheses."""
        self.pruned[i] = True
        self.prune_reasons[i] = reason
        self.eligible[i] = False
        dropped = list(self.queues[i])
        self.queues[i].clear()
        self.n_queued -= int(self.queued[i])
        self.queued[i] = 0
        return dropped

    # -- views --------------------------------------------------------------------------
    def stats(self, i: int) -> BranchStats:
        """:class:`BranchStats` of branch ``i``."""
        runs = int(self.runs[i])
        return BranchStats(
            runs=runs,
            reward_sum=float(self.reward_sum[i]),
            mean=float(self.mean[i]) if runs else math.nan,
            pending=int(self.pending[i]),
            pruned=self.prune_reasons.get(i),
            paper_emitted=bool(self.paper[i]),
            queued=int(self.queued[i]),
            failures=int(self.failures[i]),
        )

    def snapshot(self) -> dict[str, BranchStats]:
        """``{branch: BranchStats}`` in insertion order."""
        return {b: self.stats(i) for i, b in enumerate(self.branches)}

    @property
    def in_flight(self) -> int:
        return int(self.pending[: len(self.branches)].sum())

    @property
    def total_queued(self) -> int:
        return self.n_queued
