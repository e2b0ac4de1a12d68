"""What every selection policy is: :class:`Policy`, the ledger view it reads, and :func:`select`.

A policy maps the per-branch arrays of a :class:`~dask_research.experiments.ledger.BranchLedger`
(seen through :class:`LedgerView`, the part of the ledger policies may read) to one score per
branch, chooses among the scores, and may keep extra statistics through its hooks (discounted
sums, LinUCB matrices, a seeded generator). The index formulas themselves are pure functions
in the sibling modules; :func:`~.factory.make_policy` builds a policy from its name.

Examples
--------
>>> import numpy as np
>>> from dask_research.experiments.policies import Policy, select
>>> class Fewest(Policy):
...     name = "fewest-pulls"
...     def scores(self, led):
...         return -led.n[:len(led.branches)]
>>> Fewest()
Fewest()
>>> select(np.array([1.0, 3.0, 3.0]), [True, False, True])
2
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from ...exceptions import ExperimentError
from ..types import Hypothesis

__all__ = ["Policy", "FunctionPolicy", "LedgerView", "ScoreFn", "select"]

ScoreFn = Callable[[np.ndarray, np.ndarray, float, float], np.ndarray]


class LedgerView(Protocol):
    """What a policy reads of the ledger: per-branch arrays in branch order (longer than
    ``len(branches)``: slice them), the queues, and the totals."""

    branches: list[str]
    mean: np.ndarray
    n: np.ndarray
    runs: np.ndarray
    pending: np.ndarray
    reward_sum: np.ndarray
    sq_sum: np.ndarray
    eligible: np.ndarray
    total_n: int
    feature_dim: int | None

    @property
    def queues(self) -> Sequence[Sequence[Hypothesis]]: ...

    def vector_means(self) -> np.ndarray: ...


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
    masked = np.where(eligible, scores, -math.inf)
    i = int(masked.argmax())      # argmax returns the first maximum: insertion order
    if eligible[i]:
        return i
    # every eligible score is -inf (or nothing is eligible): the first eligible, if any
    idx = np.flatnonzero(eligible)
    return int(idx[0]) if len(idx) else None


class Policy:
    """Base class: scores per branch, a choice among them, optional hooks.

    Subclasses override :meth:`scores` (and :meth:`choose` when the pick is not the first
    maximum). ``rng`` is a seeded ``numpy.random.Generator`` for randomised policies (its state
    goes into checkpoints so a resumed run draws the same numbers).
    """

    name = "custom"
    fast_ucb1 = False              # the ledger's maintained-1/n fast path applies
    picks_hypothesis = False       # choose() also sets self.position (queue index)
    needs_vector = False           # needs vector rewards (objectives)
    #: An eligible branch with ``n == 0`` (no result, nothing in flight) scores above every other
    #: branch and the first such is chosen, whatever the other branches' results: while one is
    #: eligible, the next pick does not depend on results (``queue_ahead="auto"`` queues it).
    untried_first = False
    rng: np.random.Generator | None = None

    def __init__(self) -> None:
        self.position = 0

    def scores(self, led: LedgerView) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def choose(self, led: LedgerView, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        """Branch index to run next (default: the first maximum among eligible branches)."""
        self.position = 0
        i = int(np.where(eligible, scores, -math.inf).argmax())
        if eligible[i]:
            return i
        return select(scores, eligible)

    # hooks: the ledger calls them after its own bookkeeping
    def on_dispatch(self, led: LedgerView, i: int, h: Hypothesis) -> None:
        """Branch ``i`` started ``h``."""

    def on_result(self, led: LedgerView, i: int, h: Hypothesis, reward: float) -> None:
        """A result of branch ``i`` was counted (``reward`` is the scalarised reward)."""

    def on_failure(self, led: LedgerView, i: int, h: Hypothesis) -> None:
        """An experiment of branch ``i`` failed."""

    def params(self) -> dict[str, Any]:
        """Settings (JSON values) recorded in checkpoints."""
        return {}

    def rng_state(self) -> dict | None:
        """The generator's state (JSON values), or ``None`` for deterministic policies."""
        return None if self.rng is None else dict(self.rng.bit_generator.state)

    def set_rng_state(self, state: dict | None) -> None:
        if self.rng is not None and state is not None:
            self.rng.bit_generator.state = state

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v!r}"
                          for k, v in self.params().items())
        return f"{type(self).__name__}({inner})"


class FunctionPolicy(Policy):
    """A legacy ``policy(mean, n, c, total) -> scores`` function."""

    def __init__(self, fn: ScoreFn, c: float):
        super().__init__()
        self.fn = fn
        self.c = float(c)

    def scores(self, led: LedgerView) -> np.ndarray:
        k = len(led.branches)
        scores = np.array(self.fn(led.mean[:k], led.n[:k], self.c, float(led.total_n)),
                          dtype=float)
        if scores.shape != (k,):
            raise ExperimentError(
                f"policy returned scores of shape {scores.shape}; expected one score per "
                f"branch, shape ({k},)", shape=scores.shape)
        return scores

    def params(self) -> dict[str, Any]:
        return {"function": getattr(self.fn, "__qualname__", repr(self.fn))}
