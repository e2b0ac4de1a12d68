"""LinUCB over hypothesis features (Li, Chu, Langford and Schapire 2010), pending-aware.

Each hypothesis carries a feature vector ``x`` (``Hypothesis.features``); the expected reward
of running it on branch ``a`` is modelled linearly and the *hypothesis* with the largest upper
confidence bound is picked, not only a branch.

- **Disjoint** (their Algorithm 1): per branch ``A_a = ridge * I + sum x x^T``, ``b_a = sum r x``,
  ``theta_a = A_a^-1 b_a`` and ``p = x . theta_a + alpha sqrt(x^T A_a^-1 x)``.
- **Hybrid** (their Algorithm 2): a shared coefficient vector ``beta`` on features ``z`` (here
  ``z = x``, the same features, learnt across all branches) plus per-branch ``theta_a``, so a
  new branch starts from what the others taught. ``A_0 = ridge * I + sum z z^T - sum_a B_a^T
  A_a^-1 B_a`` and ``b_0 = sum r z - sum_a B_a^T A_a^-1 b_a`` are the block-eliminated form of
  their incremental updates (the same numbers).

Pending experiments add their ``x x^T`` (and ``x z^T``, ``z z^T``) at dispatch, so the
confidence width of similar hypotheses narrows at once; the reward enters ``b`` when it
arrives (until then the pull counts as reward 0, the pessimistic "constant liar" used by
every policy here). A failed experiment takes its pull back out. Pure numpy, no Dask.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies.linucb import LinUCBModel
>>> m = LinUCBModel(dim=2, alpha=1.0)
>>> m.dispatch("a", [1.0, 0.0]); m.record("a", [1.0, 0.0], 1.0)
>>> m.scores("a", np.array([[1.0, 0.0], [0.0, 1.0]])).round(4).tolist()
[1.2071, 1.0]
>>> m.scores("new", np.array([[1.0, 0.0]])).tolist()     # no evidence: width alpha * |x|
[1.0]
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..types import Hypothesis
from .base import LedgerView, Policy

__all__ = ["LinUCBPolicy", "LinUCBModel", "linucb_disjoint_scores", "linucb_hybrid_scores"]


def linucb_disjoint_scores(X: ArrayLike, A_inv: np.ndarray, b: np.ndarray,
                           alpha: float) -> np.ndarray:
    """``x . theta + alpha sqrt(x^T A^-1 x)`` for every row ``x`` of ``X`` (one branch)."""
    X_ = np.atleast_2d(np.asarray(X, dtype=float))
    theta = A_inv @ b
    width = np.einsum("ij,jk,ik->i", X_, A_inv, X_)
    return X_ @ theta + alpha * np.sqrt(np.maximum(width, 0.0))


def linucb_hybrid_scores(X: ArrayLike, Z: ArrayLike, A0_inv: np.ndarray, beta: np.ndarray,
                         A_inv: np.ndarray, B: np.ndarray, b: np.ndarray,
                         alpha: float) -> np.ndarray:
    """Li et al. (2010) Algorithm 2 scores for rows ``x`` (branch features) and ``z`` (shared).
    """
    X_ = np.atleast_2d(np.asarray(X, dtype=float))
    Z_ = np.atleast_2d(np.asarray(Z, dtype=float))
    theta = A_inv @ (b - B @ beta)
    M = A_inv @ B                                     # A_a^-1 B_a, shape (d, k)
    s = (np.einsum("ij,jk,ik->i", Z_, A0_inv, Z_)
         - 2.0 * np.einsum("ij,jk,ik->i", Z_ @ A0_inv, M.T, X_)
         + np.einsum("ij,jk,ik->i", X_, A_inv, X_)
         + np.einsum("ij,jk,ik->i", X_ @ M, A0_inv @ M.T, X_))
    return Z_ @ beta + X_ @ theta + alpha * np.sqrt(np.maximum(s, 0.0))


class _Arm:
    __slots__ = ("A", "B", "b", "_inv")

    def __init__(self, d: int, k: int, ridge: float):
        self.A = ridge * np.eye(d)
        self.B = np.zeros((d, k))
        self.b = np.zeros(d)
        self._inv: np.ndarray | None = None

    @property
    def A_inv(self) -> np.ndarray:
        if self._inv is None:
            self._inv = np.linalg.inv(self.A)
        return self._inv


class LinUCBModel:
    """Sufficient statistics of disjoint or hybrid LinUCB, keyed by branch name.

    Parameters
    ----------
    dim : int
        Length of every feature vector.
    alpha : float
        Width of the confidence bound (``>= 0``).
    hybrid : bool
        Also learn shared coefficients across branches (Algorithm 2).
    ridge : float
        ``lambda`` of the ridge regression (1 in Li et al.).
    """

    def __init__(self, dim: int, alpha: float = 1.0, hybrid: bool = False, ridge: float = 1.0):
        self.dim = int(dim)
        self.alpha = float(alpha)
        self.hybrid = bool(hybrid)
        self.ridge = float(ridge)
        k = self.dim if self.hybrid else 0
        self._k = k
        self.arms: dict[str, _Arm] = {}
        self.ZZ = np.zeros((k, k))          # sum z z^T over every pull (hybrid)
        self.bz = np.zeros(k)               # sum r z
        self._shared: tuple[np.ndarray, np.ndarray] | None = None

    def __repr__(self) -> str:
        kind = "hybrid" if self.hybrid else "disjoint"
        return f"LinUCBModel({kind}, dim={self.dim}, alpha={self.alpha:g}, {len(self.arms)} arms)"

    def _arm(self, branch: str) -> _Arm:
        arm = self.arms.get(branch)
        if arm is None:
            arm = self.arms[branch] = _Arm(self.dim, self._k, self.ridge)
        return arm

    def _pull(self, branch: str, x: ArrayLike, sign: float) -> None:
        x_ = np.asarray(x, dtype=float)
        arm = self._arm(branch)
        arm.A += sign * np.outer(x_, x_)
        arm._inv = None
        if self.hybrid:
            arm.B += sign * np.outer(x_, x_)
            self.ZZ += sign * np.outer(x_, x_)
            self._shared = None

    def dispatch(self, branch: str, x: ArrayLike) -> None:
        """An experiment with features ``x`` started on ``branch``: narrow the width now."""
        self._pull(branch, x, 1.0)

    def record(self, branch: str, x: ArrayLike, reward: float) -> None:
        """Its reward arrived."""
        x_ = np.asarray(x, dtype=float)
        arm = self._arm(branch)
        arm.b += reward * x_
        if self.hybrid:
            self.bz += reward * x_
            self._shared = None

    def cancel(self, branch: str, x: ArrayLike) -> None:
        """It failed: take the pull back out."""
        self._pull(branch, x, -1.0)

    def shared(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A_0^-1, beta)`` of the hybrid model."""
        if self._shared is None:
            A0 = self.ridge * np.eye(self._k) + self.ZZ
            b0 = self.bz.copy()
            for arm in self.arms.values():
                Ai = arm.A_inv
                A0 -= arm.B.T @ Ai @ arm.B
                b0 -= arm.B.T @ Ai @ arm.b
            A0_inv = np.linalg.inv(A0)
            self._shared = (A0_inv, A0_inv @ b0)
        return self._shared

    def scores(self, branch: str, X: ArrayLike) -> np.ndarray:
        """Upper confidence bounds of the rows of ``X`` run on ``branch``."""
        arm = self.arms.get(branch) or _Arm(self.dim, self._k, self.ridge)
        if not self.hybrid:
            return linucb_disjoint_scores(X, arm.A_inv, arm.b, self.alpha)
        A0_inv, beta = self.shared()
        return linucb_hybrid_scores(X, X, A0_inv, beta, arm.A_inv, arm.B, arm.b, self.alpha)

    def state(self) -> dict[str, Any]:
        """Plain-list snapshot (for reports and tests)."""
        return {"dim": self.dim, "alpha": self.alpha, "hybrid": self.hybrid,
                "arms": {b: {"A": a.A.tolist(), "b": a.b.tolist()} for b, a in self.arms.items()}}


class LinUCBPolicy(Policy):
    """LinUCB over ``Hypothesis.features`` (:mod:`.linucb`): picks a hypothesis.

    ``scores`` per branch is the best upper bound among its queued hypotheses (``-inf`` when
    it has none); ``choose`` also sets ``position``, the index of that hypothesis in the
    branch's queue.
    """

    name = "linucb"
    picks_hypothesis = True

    def __init__(self, alpha: float = 1.0, hybrid: bool = False, ridge: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)
        self.hybrid = bool(hybrid)
        self.ridge = float(ridge)
        if self.hybrid:
            self.name = "linucb-hybrid"
        self.model: LinUCBModel | None = None
        self._best_pos: np.ndarray = np.zeros(0, int)

    def _model(self, dim: int) -> LinUCBModel:
        if self.model is None:
            self.model = LinUCBModel(dim, self.alpha, self.hybrid, self.ridge)
        return self.model

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        out = np.full(k, -math.inf)
        self._best_pos = np.zeros(k, int)
        dim = led.feature_dim
        if dim is None:
            return out
        model = self._model(dim)
        for i in map(int, np.flatnonzero(led.eligible[:k])):
            q = led.queues[i]
            X = np.array([h.features for h in q], dtype=float)
            s = model.scores(led.branches[i], X)
            j = int(s.argmax())
            out[i], self._best_pos[i] = s[j], j
        return out

    def choose(self, led: LedgerView, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        i = super().choose(led, scores, eligible)
        self.position = int(self._best_pos[i]) if i is not None and i < len(self._best_pos) else 0
        return i

    def on_dispatch(self, led: LedgerView, i: int, h: Hypothesis) -> None:
        self._model(len(h.features)).dispatch(h.branch, h.features)  # type: ignore[arg-type]

    def on_result(self, led: LedgerView, i: int, h: Hypothesis, reward: float) -> None:
        self._model(len(h.features)).record(h.branch, h.features, reward)  # type: ignore[arg-type]

    def on_failure(self, led: LedgerView, i: int, h: Hypothesis) -> None:
        self._model(len(h.features)).cancel(h.branch, h.features)  # type: ignore[arg-type]

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "hybrid": self.hybrid, "ridge": self.ridge}
