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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..exceptions import ExperimentError
from .policies.base import Policy, select
from .policies.ucb1 import UCB1Policy
from .types import BranchStats, ExperimentResult, Hypothesis

__all__ = ["BranchLedger"]


class BranchLedger:
    """Queues and statistics of every branch, in insertion order.

    Parameters
    ----------
    c : float
        UCB1 exploration constant.
    policy : Policy, optional
        The :class:`~.policies.Policy` (build one from a name with
        :func:`~.policies.make_policy`); default UCB1 with ``c``.
    objectives : sequence of (name, "max" | "min"), optional
        Declared objectives of vector rewards; ``Result.reward`` is then a vector (or a
        ``{name: value}`` dict) and the scalar statistics use ``weights``.
    weights : sequence of float, optional
        Weights of the objectives in the scalar mean (default equal); normalised to sum 1.
    bounded : bool
        Rewards in [0, 1]: a ``"min"`` objective ``x`` counts as ``1 - x`` (else ``-x``).
    """

    def __init__(self, c: float, policy: Policy | None = None, capacity: int = 16,
                 objectives: Sequence[tuple[str, str]] | None = None,
                 weights: Sequence[float] | None = None, bounded: bool = True):
        self.c = float(c)
        if policy is not None and not isinstance(policy, Policy):
            raise ExperimentError(
                f"policy must be a Policy, got {type(policy).__name__}; build one with "
                "make_policy(name_or_function)", value=policy)
        self.policy: Policy = UCB1Policy(self.c) if policy is None else policy
        self._fast = self.policy.fast_ucb1
        self.bounded = bool(bounded)
        self.objectives: tuple[str, ...] = tuple(o[0] for o in objectives or ())
        self.directions: tuple[str, ...] = tuple(o[1] for o in objectives or ())
        self.dims = len(self.objectives)
        if self.dims:
            w = np.ones(self.dims) if weights is None else np.asarray(weights, dtype=float)
            self.weights = w / w.sum()
            self._sign = np.array([1.0 if d == "max" else -1.0 for d in self.directions])
            self._offset = np.array([0.0 if d == "max" else (1.0 if self.bounded else 0.0)
                                     for d in self.directions])
        if self.policy.needs_vector and not self.dims:
            raise ExperimentError(
                f"policy {self.policy.name!r} needs vector rewards; declare them, e.g. "
                "objectives={'accuracy': 'max', 'cost': 'min'}", policy=self.policy.name)
        self.feature_dim: int | None = None
        self.branches: list[str] = []
        self.index: dict[str, int] = {}
        self.queues: list[deque[Hypothesis]] = []
        self.ids: set[str] = set()
        self.total_n = 0          # sum of runs + pending over all branches
        self.total_runs = 0
        self.n_queued = 0         # sum of queued over all branches
        self.n_sourced = 0        # branches with a live hypothesis source (see .sources)
        self.best_ids: list[str | None] = []   # id of each branch's best result
        self.holder: int | None = None         # branch holding the best result overall
        self.revived: set[int] = set()         # pruned, then brought back (see revive)
        self._alloc(capacity)

    # -- storage ------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        k = len(self.branches)

        def grow(name: str, dtype: type) -> np.ndarray:
            new: np.ndarray = np.zeros(capacity, dtype=dtype)
            old = getattr(self, name, None)
            if old is not None:
                new[:k] = old[:k]
            return new

        self.runs = grow("runs", np.int64)
        self.pending = grow("pending", np.int64)
        self.n = grow("n", np.float64)            # runs + pending, float for the policy
        self.inv_n = grow("inv_n", np.float64)    # 1 / n, +inf where n == 0 (UCB1 fast path)
        self.reward_sum = grow("reward_sum", np.float64)
        self.sq_sum = grow("sq_sum", np.float64)    # sum of squared (scalar) rewards
        self.mean = grow("mean", np.float64)      # 0 until the first result
        self.queued = grow("queued", np.int64)
        self.failures = grow("failures", np.int64)
        self.eligible = grow("eligible", np.bool_)  # queued > 0 and not pruned
        self.pruned = grow("pruned", np.bool_)
        self.paper = grow("paper", np.bool_)
        self.sourced = grow("sourced", np.bool_)  # a live source proposes when the queue is empty
        best = np.full(capacity, -math.inf)       # best (scalar) reward of each branch
        old_best = getattr(self, "best", None)
        if old_best is not None:
            best[:k] = old_best[:k]
        self.best = best
        self.prune_reasons: dict[int, str] = getattr(self, "prune_reasons", {})
        if self.dims:
            new = np.zeros((capacity, self.dims))
            old = getattr(self, "vsum", None)
            if old is not None:
                new[:k] = old[:k]
            self.vsum = new                         # raw (as reported) reward vectors summed

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
            self.best_ids.append(None)
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
    def validate(self, hypotheses: Iterable[Hypothesis]) -> list[Hypothesis]:
        """Check a batch before it is queued (types, unique ids, features as the policy needs
        them); returns it as a list for :meth:`add` with ``checked=True``."""
        batch = self._check_ids(hypotheses, self.ids)
        self._check_features(batch)
        return batch

    @staticmethod
    def _check_ids(hypotheses: Iterable[Hypothesis], seen: set[str]) -> list[Hypothesis]:
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

    def _check_features(self, batch: list[Hypothesis]) -> None:
        dim = self.feature_dim
        for h in batch:
            f = h.features
            if f is None:
                if self.policy.picks_hypothesis:
                    raise ExperimentError(
                        f"policy {self.policy.name!r} needs Hypothesis.features, but "
                        f"{h.id!r} has none; e.g. Hypothesis('h1', 'b', features=(0.3, 1.0))",
                        id=h.id)
                continue
            if dim is None:
                dim = len(f)
            if len(f) != dim or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                        for v in f):
                raise ExperimentError(
                    f"features of {h.id!r} are {f!r}; expected {dim} finite numbers like "
                    "the other hypotheses", id=h.id)
        if dim is not None:
            self.feature_dim = dim

    def add(self, hypotheses: Iterable[Hypothesis], checked: bool = False) -> list[Hypothesis]:
        """Queue hypotheses (all or none). Returns those dropped because their branch is pruned.

        ``checked=True``: the batch comes from :meth:`validate` and is not checked again."""
        batch = list(hypotheses) if checked else self.validate(hypotheses)
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
        total = self.total_n
        c = getattr(self.policy, "c", self.c)
        if self._fast and total > 1 and c > 0:
            k = len(self.branches)
            # UCB1 from the maintained 1/n: three vectorised operations; +inf stays +inf where
            # n == 0 (equal to ucb1_scores, which the tests check against a model)
            scores = self.inv_n[:k] * (c * c * math.log(total))
            np.sqrt(scores, out=scores)
            scores += self.mean[:k]
            return scores
        return np.array(self.policy.scores(self), dtype=float)   # a copy: events keep it

    def has_work(self) -> bool:
        """Whether any unpruned branch has queued hypotheses or a live source."""
        return self.n_queued > 0 or self.n_sourced > 0

    def forced_pick(self) -> bool:
        """Whether the next pick does not depend on results: the policy picks an untried branch
        first (:attr:`~.policies.Policy.untried_first`) and one is eligible (no result, nothing
        in flight)."""
        if not self.policy.untried_first:
            return False
        k = len(self.branches)
        return bool(np.any(self.eligible[:k] & (self.n[:k] == 0)))

    def set_sourced(self, i: int, live: bool) -> None:
        """Mark branch ``i`` as having a live hypothesis source (eligible while unpruned even
        with an empty queue) or not (an exhausted source)."""
        live = bool(live) and not self.pruned[i]
        if live != bool(self.sourced[i]):
            self.n_sourced += 1 if live else -1
        self.sourced[i] = live
        self.eligible[i] = live or self.queued[i] > 0

    def select(self) -> tuple[int, np.ndarray] | None:
        """``(branch index, scores)`` of the next pick, or ``None`` when nothing is eligible.

        For policies that pick a hypothesis (LinUCB), ``policy.position`` is then the index of
        the chosen hypothesis in the branch's queue; :meth:`pop` takes that one.
        """
        if not self.has_work():
            return None
        k = len(self.branches)
        scores = self.scores()
        eligible = self.eligible[:k]
        if self._fast:
            i = int(np.where(eligible, scores, -math.inf).argmax())  # first maximum: ties
            if not eligible[i]:                                       # to insertion order
                j = select(scores, eligible)
                return None if j is None else (j, scores)
            return i, scores
        j = self.policy.choose(self, scores, eligible)
        return None if j is None else (j, scores)

    def pop(self, i: int, position: int | None = None) -> Hypothesis:
        """Take a queued hypothesis of branch ``i`` (the oldest, or the one the policy chose);
        it counts as pending."""
        if position is None:
            position = self.policy.position if self.policy.picks_hypothesis else 0
        q = self.queues[i]
        if position == 0:
            h = q.popleft()
        else:
            h = q[position]
            del q[position]
        self._started(i, h)
        return h

    def take(self, branch: str, hid: str) -> Hypothesis:
        """Take hypothesis ``hid`` out of ``branch``'s queue (restoring a checkpoint)."""
        i = self.branch_index(branch)
        for pos, h in enumerate(self.queues[i]):
            if h.id == hid:
                return self.pop(i, pos)
        raise ExperimentError(f"hypothesis {hid!r} is not queued on branch {branch!r}",
                              id=hid, branch=branch)

    def _started(self, i: int, h: Hypothesis) -> None:
        self.queued[i] -= 1
        self.n_queued -= 1
        if self.queued[i] == 0 and not self.sourced[i]:
            self.eligible[i] = False
        self.pending[i] += 1
        self._count(i, 1.0)
        self.total_n += 1
        self.policy.on_dispatch(self, i, h)

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

    def scalar(self, reward: Any) -> tuple[float, np.ndarray | None]:
        """``(scalar reward, raw vector or None)`` of a (possibly vector) reward."""
        if not self.dims:
            return float(reward), None
        v = np.asarray(reward, dtype=float)
        oriented = self._offset + self._sign * v
        return float(self.weights @ oriented), v

    def vector_means(self) -> np.ndarray:
        """Oriented (maximised) mean reward vectors, shape ``(branches, objectives)``; 0 rows
        for branches without results."""
        k = len(self.branches)
        runs = self.runs[:k].astype(float)[:, None]
        raw = np.divide(self.vsum[:k], runs, out=np.zeros((k, self.dims)), where=runs > 0)
        return np.where(runs > 0, self._offset + self._sign * raw, 0.0)

    def raw_means(self, i: int) -> dict[str, float] | None:
        """``{objective: mean as reported}`` of branch ``i`` (``None`` for scalar rewards)."""
        if not self.dims:
            return None
        r = int(self.runs[i])
        return {o: (float(self.vsum[i, d]) / r if r else math.nan)
                for d, o in enumerate(self.objectives)}

    def record(self, result: ExperimentResult) -> int:
        """Count a successful result; returns the branch index (see :meth:`stats`)."""
        h = result.hypothesis
        i = self._settle(h)
        reward, vec = self.scalar(result.reward)
        self.runs[i] += 1
        self._count(i, 1.0)
        self.total_n += 1
        self.total_runs += 1
        self.reward_sum[i] += reward
        self.sq_sum[i] += reward * reward
        if vec is not None:
            self.vsum[i] += vec
        self.mean[i] = self.reward_sum[i] / self.runs[i]
        if reward > self.best[i]:
            self.best[i] = reward
            self.best_ids[i] = h.id
            if self.holder is None or reward > self.best[self.holder]:
                self.holder = i
        self.policy.on_result(self, i, h, reward)
        return i

    def record_failure(self, h: Hypothesis) -> int:
        """Count a failed experiment (no reward; it frees its pending pull); returns the index."""
        i = self._settle(h)
        self.failures[i] += 1
        self.policy.on_failure(self, i, h)
        return i

    def prune(self, i: int, reason: str) -> list[Hypothesis]:
        """Exclude branch ``i`` from scheduling; returns its dropped queued hypotheses."""
        self.set_sourced(i, False)
        self.pruned[i] = True
        self.prune_reasons[i] = reason
        self.eligible[i] = False
        dropped = list(self.queues[i])
        self.queues[i].clear()
        self.n_queued -= int(self.queued[i])
        self.queued[i] = 0
        return dropped

    def revive(self, i: int) -> None:
        """Bring pruned branch ``i`` back (its queue stays empty; the caller marks its source
        live): a search with budget left and nothing else to run (:meth:`.scheduler_run.Run.
        revive_parked`). A revived branch is not pruned again for its results."""
        self.pruned[i] = False
        self.prune_reasons.pop(i, None)
        self.revived.add(i)

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
            means=self.raw_means(i),
            best=float(self.best[i]) if runs else math.nan,
            best_hypothesis=self.best_ids[i],
        )

    def snapshot(self) -> dict[str, BranchStats]:
        """``{branch: BranchStats}`` in insertion order."""
        return {b: self.stats(i) for i, b in enumerate(self.branches)}

    @property
    def best_seen(self) -> float:
        """Best (scalar) reward of any branch so far (``-inf`` before the first result)."""
        return -math.inf if self.holder is None else float(self.best[self.holder])

    @property
    def in_flight(self) -> int:
        return int(self.pending[: len(self.branches)].sum())

    @property
    def total_queued(self) -> int:
        return self.n_queued
