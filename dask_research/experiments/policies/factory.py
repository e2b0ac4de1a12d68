"""Policies by name: :func:`make_policy` and :data:`POLICY_NAMES`.

:func:`make_policy` builds a :class:`~.base.Policy` from a name::

    "ucb1" (default) | "ucb1-tuned" | "kl-ucb" | "thompson" | "thompson-gaussian"
    | "discounted-ucb" | "pareto-ucb1" | "linucb" | "linucb-hybrid"

or wraps a legacy ``policy(mean, n, c, total) -> scores`` function (the max-bandit policies of
``objective="max"`` are built by :func:`~.maxbandit.make_max_policy`).

Examples
--------
>>> from dask_research.experiments import Hypothesis
>>> from dask_research.experiments.ledger import BranchLedger
>>> from dask_research.experiments.policies import make_policy
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
from typing import Any

from ...exceptions import InputError
from .base import FunctionPolicy, Policy, ScoreFn
from .discounted import DiscountedUCBPolicy
from .klucb import KLUCBPolicy
from .linucb import LinUCBPolicy
from .pareto import ParetoUCB1Policy
from .thompson import ThompsonPolicy
from .tuned import UCB1TunedPolicy
from .ucb1 import UCB1Policy

__all__ = ["make_policy", "POLICY_NAMES"]

POLICY_NAMES = ("ucb1", "ucb1-tuned", "kl-ucb", "thompson", "thompson-gaussian",
                "discounted-ucb", "pareto-ucb1", "linucb", "linucb-hybrid")


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

