"""Selection policies: index formulas as pure numpy functions, and the Policy objects that
read them off the ledger.

One module per family: :mod:`.ucb1` (the default, with the round-robin and greedy baselines),
:mod:`.tuned` (UCB1-Tuned), :mod:`.klucb`, :mod:`.thompson`, :mod:`.discounted`,
:mod:`.pareto` (vector rewards), :mod:`.linucb` (hypothesis features) and :mod:`.maxbandit`
(``objective="max"``); :mod:`.base` defines :class:`Policy` and :func:`select`, and
:mod:`.factory` builds a policy from its name (:func:`make_policy`). Nothing here imports Dask
or asyncio.

Examples
--------
>>> from dask_research.experiments.policies import make_policy, select, ucb1_scores
>>> s = ucb1_scores(mean=[0.5, 0.9, 0.0], n=[2, 1, 0], c=2 ** 0.5)
>>> select(s, eligible=[True, True, False])
1
>>> make_policy("kl-ucb").name
'kl-ucb'
"""
from __future__ import annotations

from .base import FunctionPolicy, LedgerView, Policy, ScoreFn, select
from .discounted import DiscountedUCBPolicy, discount_update, discounted_ucb_scores
from .factory import POLICY_NAMES, make_policy
from .klucb import KLUCBPolicy, bernoulli_kl, kl_ucb_scores
from .linucb import LinUCBModel, LinUCBPolicy
from .maxbandit import (
    MAX_POLICY_NAMES,
    QuantileUCBPolicy,
    ThresholdAscentPolicy,
    make_max_policy,
    quantile_ucb_index,
    threshold_ascent_index,
)
from .pareto import ParetoUCB1Policy, dominates, pareto_front, pareto_ucb1_indices
from .thompson import ThompsonPolicy, thompson_scores
from .tuned import UCB1TunedPolicy, ucb1_tuned_score, ucb1_tuned_scores
from .ucb1 import UCB1Policy, greedy_scores, log_pulls, round_robin_scores, ucb1_score, ucb1_scores

__all__ = [
    "Policy", "FunctionPolicy", "LedgerView", "ScoreFn", "select", "make_policy", "POLICY_NAMES",
    "UCB1Policy", "ucb1_score", "ucb1_scores", "log_pulls", "round_robin_scores", "greedy_scores",
    "UCB1TunedPolicy", "ucb1_tuned_score", "ucb1_tuned_scores",
    "KLUCBPolicy", "kl_ucb_scores", "bernoulli_kl",
    "ThompsonPolicy", "thompson_scores",
    "DiscountedUCBPolicy", "discounted_ucb_scores", "discount_update",
    "ParetoUCB1Policy", "pareto_front", "pareto_ucb1_indices", "dominates",
    "LinUCBPolicy", "LinUCBModel",
    "MAX_POLICY_NAMES", "make_max_policy", "QuantileUCBPolicy", "ThresholdAscentPolicy",
    "quantile_ucb_index", "threshold_ascent_index",
]
