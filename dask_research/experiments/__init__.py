"""UCB iteration scheduler for research loops.

A queue of :class:`Hypothesis` objects, grouped in research branches, feeds parallel experiment
slots; results flow back and decide what runs next. UCB1 (with experiments in flight counted
as pending pulls) picks the branch, a separate gate prunes weak branches, strong branches
trigger a paper stage once, and an expander can queue follow-ups. Every decision is an event.

Other policies (``policy=``): UCB1-Tuned, KL-UCB, Thompson sampling, discounted UCB for
drifting rewards, Pareto UCB1 for vector rewards (``objectives=``) and LinUCB over hypothesis
features; ``checkpoint=`` makes a run crash-safe (:meth:`IterationScheduler.resume`; one driver
per journal, every record checksummed), ``timeout=`` and ``max_seconds`` keep a hanging runner
from holding the run, and ``apply_order="dispatch"`` makes it reproducible under parallelism.
For searches,
``objective="max"`` looks for the branch of the best single result, ``ask``/``tell`` let your
own loop run the experiments, and ``Branch(name, propose=...)`` (e.g. an
:class:`OptunaSource`) proposes hypotheses lazily.

Examples
--------
>>> from dask_research.experiments import (Hypothesis, IterationScheduler,
...                                        make_deterministic_runner)
>>> runner = make_deterministic_runner({"a": 0.9, "b": 0.5, "c": 0.05}, delay_ms=1)
>>> sched = IterationScheduler(runner, slots=3, progress=False)
>>> sched.add([Hypothesis(f"{b}{k}", b) for k in range(5) for b in "abc"])
>>> report = sched.run()
>>> report.stop_reason, report.paper_triggers, report.branches["c"].pruned
('queue_empty', ['a'], 'low-mean')
"""
from __future__ import annotations

from .checkpoint import JournalLegacyWarning
from .decision_trace import EVENT_KINDS, Event, Interval, SlotInterval, Trace
from .lock import JournalLock, JournalLockWarning
from .loop import IterationScheduler
from .objectives import OBJECTIVES
from .policies import MAX_POLICY_NAMES, POLICY_NAMES, Policy, make_policy
from .report import Report
from .runners import deterministic_expander, make_deterministic_runner, make_followup_expander
from .sources import Branch, HypothesisSource
from .timeouts import ExperimentTimeout
from .types import BranchStats, ExperimentResult, Hypothesis, Result

__all__ = [
    "Hypothesis",
    "ExperimentResult",
    "Result",
    "BranchStats",
    "IterationScheduler",
    "Report",
    "Event",
    "Trace",
    "SlotInterval",
    "Interval",
    "EVENT_KINDS",
    "Branch",
    "HypothesisSource",
    "OptunaSource",
    "Policy",
    "make_policy",
    "POLICY_NAMES",
    "MAX_POLICY_NAMES",
    "OBJECTIVES",
    "make_deterministic_runner",
    "make_followup_expander",
    "deterministic_expander",
    "ExperimentTimeout",
    "JournalLock",
    "JournalLockWarning",
    "JournalLegacyWarning",
]

# internal names the package exported before: importable from here still (with a
# DeprecationWarning), documented where they live
_MOVED = {
    "BranchLedger": "ledger",
    **dict.fromkeys(("ucb1_score", "ucb1_scores", "select", "ucb1_tuned_scores", "kl_ucb_scores",
                     "thompson_scores", "discounted_ucb_scores", "pareto_ucb1_indices",
                     "pareto_front", "LinUCBModel", "QuantileUCBPolicy", "ThresholdAscentPolicy",
                     "quantile_ucb_index", "threshold_ascent_index"), "policies"),
}


def __getattr__(name: str):
    if name == "OptunaSource":      # lazy: optuna is an optional extra
        from .optuna_source import OptunaSource

        return OptunaSource
    if name in _MOVED:
        import importlib
        import warnings

        where = f"{__name__}.{_MOVED[name]}"
        warnings.warn(f"{__name__}.{name} is internal; import it from {where}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), name)
    raise AttributeError(name)
