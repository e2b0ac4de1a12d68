"""Selection policies as small objects: each maps the ledger's arrays to a pure function.

The index formulas live in pure modules (:mod:`.policies` for UCB1, :mod:`.tuned`,
:mod:`.klucb`, :mod:`.thompson`, :mod:`.discounted`, :mod:`.pareto`, :mod:`.linucb`); a
:class:`Policy` here only says which arrays of a :class:`~.ledger.BranchLedger` each needs,
how to choose among the scores, and which extra statistics it keeps (discounted sums, LinUCB
matrices, a seeded generator). :func:`make_policy` builds one from a name::

    "ucb1" (default) | "ucb1-tuned" | "kl-ucb" | "thompson" | "thompson-gaussian"
    | "discounted-ucb" | "pareto-ucb1" | "linucb" | "linucb-hybrid"

or wraps a legacy ``policy(mean, n, c, total) -> scores`` function.

Examples
--------
>>> from dask_research.experiments import Hypothesis, Result
>>> from dask_research.experiments.ledger import BranchLedger
>>> from dask_research.experiments.scoring import make_policy
>>> led = BranchLedger(c=1.0, policy=make_policy("kl-ucb"))
>>> _ = led.add([Hypothesis("a1", "a"), Hypothesis("b1", "b"), Hypothesis("a2", "a")])
>>> i, scores = led.select(); led.branches[i]
'a'
>>> make_policy("discounted-ucb", gamma=0.9)
DiscountedUCBPolicy(c=1.41421, gamma=0.9)
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..exceptions import ExperimentError, InputError
from . import policies
from .discounted import discount_update, discounted_ucb_scores
from .klucb import kl_ucb_scores
from .linucb import LinUCBModel
from .pareto import pareto_front, pareto_select, pareto_ucb1_indices
from .thompson import thompson_scores
from .tuned import ucb1_tuned_scores

if TYPE_CHECKING:
    from .ledger import BranchLedger
    from .types import Hypothesis

__all__ = ["Policy", "make_policy", "POLICY_NAMES"]

POLICY_NAMES = ("ucb1", "ucb1-tuned", "kl-ucb", "thompson", "thompson-gaussian",
                "discounted-ucb", "pareto-ucb1", "linucb", "linucb-hybrid")

ScoreFn = Callable[[np.ndarray, np.ndarray, float, float], np.ndarray]


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
    rng: np.random.Generator | None = None

    def __init__(self) -> None:
        self.position = 0

    def scores(self, led: BranchLedger) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def choose(self, led: BranchLedger, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        """Branch index to run next (default: the first maximum among eligible branches)."""
        self.position = 0
        i = int(np.where(eligible, scores, -math.inf).argmax())
        if eligible[i]:
            return i
        return policies.select(scores, eligible)

    # hooks: the ledger calls them after its own bookkeeping
    def on_dispatch(self, led: BranchLedger, i: int, h: Hypothesis) -> None:
        """Branch ``i`` started ``h``."""

    def on_result(self, led: BranchLedger, i: int, h: Hypothesis, reward: float) -> None:
        """A result of branch ``i`` was counted (``reward`` is the scalarised reward)."""

    def on_failure(self, led: BranchLedger, i: int, h: Hypothesis) -> None:
        """An experiment of branch ``i`` failed."""

    def params(self) -> dict[str, Any]:
        """Settings (JSON values) recorded in checkpoints."""
        return {}

    def rng_state(self) -> dict | None:
        return None if self.rng is None else self.rng.bit_generator.state

    def set_rng_state(self, state: dict | None) -> None:
        if self.rng is not None and state is not None:
            self.rng.bit_generator.state = state

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v!r}"
                          for k, v in self.params().items())
        return f"{type(self).__name__}({inner})"


class UCB1Policy(Policy):
    """UCB1 with pending pulls (:func:`.policies.ucb1_scores`); the default."""

    name = "ucb1"
    fast_ucb1 = True

    def __init__(self, c: float = 2 ** 0.5):
        super().__init__()
        self.c = float(c)

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        return policies.ucb1_scores(led.mean[:k], led.n[:k], self.c, float(led.total_n))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}


class FunctionPolicy(Policy):
    """A legacy ``policy(mean, n, c, total) -> scores`` function."""

    def __init__(self, fn: ScoreFn, c: float):
        super().__init__()
        self.fn = fn
        self.c = float(c)

    def scores(self, led: BranchLedger) -> np.ndarray:
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


class UCB1TunedPolicy(Policy):
    """UCB1-Tuned (:func:`.tuned.ucb1_tuned_scores`)."""

    name = "ucb1-tuned"

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        return ucb1_tuned_scores(led.mean[:k], led.sq_sum[:k], led.runs[:k], led.n[:k],
                                 float(led.total_n))


class KLUCBPolicy(Policy):
    """KL-UCB for rewards in [0, 1] (:func:`.klucb.kl_ucb_scores`)."""

    name = "kl-ucb"

    def __init__(self, c: float = 0.0):
        super().__init__()
        self.c = float(c)

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        return kl_ucb_scores(led.mean[:k], led.n[:k], self.c, float(led.total_n))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}


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
        self.rng = np.random.default_rng(self.seed)

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        return thompson_scores(led.reward_sum[:k], led.runs[:k], led.n[:k], self.rng,
                               self.bounded, led.sq_sum[:k])

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed, "bounded": self.bounded}


class DiscountedUCBPolicy(Policy):
    """Discounted UCB (:mod:`.discounted`); keeps discounted counts and sums per branch."""

    name = "discounted-ucb"

    def __init__(self, c: float = 2 ** 0.5, gamma: float = 0.99):
        super().__init__()
        self.c = float(c)
        self.gamma = float(gamma)
        self.disc_n = np.zeros(16)
        self.disc_sum = np.zeros(16)

    def _fit(self, k: int) -> None:
        if k > len(self.disc_n):
            size = max(k, 2 * len(self.disc_n))
            self.disc_n = np.concatenate([self.disc_n, np.zeros(size - len(self.disc_n))])
            self.disc_sum = np.concatenate([self.disc_sum, np.zeros(size - len(self.disc_sum))])

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        self._fit(k)
        return discounted_ucb_scores(self.disc_n[:k], self.disc_sum[:k], led.pending[:k],
                                     self.c)

    def on_result(self, led: BranchLedger, i: int, h: Hypothesis, reward: float) -> None:
        self._fit(len(led.branches))
        discount_update(self.disc_n, self.disc_sum, i, reward, self.gamma)

    def params(self) -> dict[str, Any]:
        return {"c": self.c, "gamma": self.gamma}


class ParetoUCB1Policy(Policy):
    """Pareto UCB1 over vector rewards (:mod:`.pareto`); a seeded uniform pick in the front.

    ``scores`` (what ``select`` events record) is the mean of each branch's per-objective
    indices; ``last_front`` holds the non-dominated mask of the latest decision.
    """

    name = "pareto-ucb1"
    needs_vector = True

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.last_front: np.ndarray = np.zeros(0, bool)
        self._indices: np.ndarray | None = None

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        mu = led.vector_means()
        self._indices = pareto_ucb1_indices(mu, led.n[:k], total=float(led.total_n))
        return self._indices.mean(axis=1)

    def choose(self, led: BranchLedger, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        self.position = 0
        assert self._indices is not None
        i, self.last_front = pareto_select(self._indices, eligible, self.rng)
        return i

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed}


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

    def scores(self, led: BranchLedger) -> np.ndarray:
        k = len(led.branches)
        out = np.full(k, -math.inf)
        self._best_pos = np.zeros(k, int)
        dim = led.feature_dim
        if dim is None:
            return out
        model = self._model(dim)
        for i in np.flatnonzero(led.eligible[:k]):
            q = led.queues[i]
            X = np.array([h.features for h in q], dtype=float)
            s = model.scores(led.branches[i], X)
            j = int(s.argmax())
            out[i], self._best_pos[i] = s[j], j
        return out

    def choose(self, led: BranchLedger, scores: np.ndarray, eligible: np.ndarray) -> int | None:
        i = super().choose(led, scores, eligible)
        self.position = int(self._best_pos[i]) if i is not None and i < len(self._best_pos) else 0
        return i

    def on_dispatch(self, led: BranchLedger, i: int, h: Hypothesis) -> None:
        self._model(len(h.features)).dispatch(h.branch, h.features)  # type: ignore[arg-type]

    def on_result(self, led: BranchLedger, i: int, h: Hypothesis, reward: float) -> None:
        self._model(len(h.features)).record(h.branch, h.features, reward)  # type: ignore[arg-type]

    def on_failure(self, led: BranchLedger, i: int, h: Hypothesis) -> None:
        self._model(len(h.features)).cancel(h.branch, h.features)  # type: ignore[arg-type]

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "hybrid": self.hybrid, "ridge": self.ridge}


def _positive(name: str, value: Any, ok: Callable[[float], bool], expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise InputError(name, value, expected, where="policy")
    return float(value)


def make_policy(policy: str | Policy | ScoreFn | None = "ucb1", *, c: float = 2 ** 0.5,
                gamma: float = 0.99, alpha: float = 1.0, seed: int = 0, bounded: bool = True,
                kl_c: float = 0.0) -> Policy:
    """A :class:`Policy` from a name (see :data:`POLICY_NAMES`), a Policy, or a function.

    Parameters
    ----------
    policy : str, Policy or callable
        The name, an instance (returned as is) or ``fn(mean, n, c, total) -> scores``.
    c : float
        Exploration constant of UCB1 and discounted UCB.
    gamma : float
        Discount factor of ``"discounted-ucb"`` in (0, 1].
    alpha : float
        Confidence width of LinUCB (``>= 0``).
    seed : int
        Seed of the generator of ``"thompson"`` and ``"pareto-ucb1"``.
    bounded : bool
        Rewards in [0, 1]: Beta (not Gaussian) Thompson sampling; KL-UCB requires it.
    kl_c : float
        Weight of KL-UCB's ``ln ln N`` term.
    """
    if policy is None:
        policy = "ucb1"
    if isinstance(policy, Policy):
        return policy
    if callable(policy):
        return FunctionPolicy(policy, c)
    if not isinstance(policy, str) or policy not in POLICY_NAMES:
        raise InputError("policy", policy, "one of " + ", ".join(repr(p) for p in POLICY_NAMES)
                         + ", a Policy or a function (mean, n, c, total) -> scores",
                         where="IterationScheduler")
    if policy == "ucb1":
        return UCB1Policy(c)
    if policy == "ucb1-tuned":
        return UCB1TunedPolicy()
    if policy == "kl-ucb":
        if not bounded:
            raise InputError("policy", policy, "a policy for unbounded rewards: KL-UCB needs "
                             "rewards in [0, 1] (bounded=True)", where="IterationScheduler")
        return KLUCBPolicy(_positive("kl_c", kl_c, lambda v: v >= 0, "a number >= 0"))
    if policy == "thompson":
        return ThompsonPolicy(int(seed), bounded)
    if policy == "thompson-gaussian":
        return ThompsonPolicy(int(seed), bounded=False)
    if policy == "discounted-ucb":
        g = _positive("gamma", gamma, lambda v: 0 < v <= 1, "a number in (0, 1]")
        return DiscountedUCBPolicy(c, g)
    if policy == "pareto-ucb1":
        return ParetoUCB1Policy(int(seed))
    a = _positive("alpha", alpha, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
    return LinUCBPolicy(a, hybrid=policy == "linucb-hybrid")


def pareto_mask(vectors: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Re-export of :func:`.pareto.pareto_front` for the report."""
    return pareto_front(vectors, mask)
