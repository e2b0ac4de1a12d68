"""The gates applied to every outcome, in order: pruning, then the paper trigger.

Pure decisions over a branch's statistics, no I/O; :mod:`.scheduler_run` applies them after each
outcome (and changes the state through :class:`~.books.Books`, whose same methods replay a
journal on resume, so a gate's effect is written once). Three flavours: the scalar mean
(``prune_floor`` / ``paper_threshold`` numbers), per-objective thresholds of vector rewards
(dicts), and ``objective="max"`` (:mod:`.policies.maxbandit`).

Examples
--------
>>> from dask_research.experiments.gates import prune_reason, should_trigger_paper
>>> prune_reason(3, 0.1, 0, prune_after_runs=3, prune_floor=0.2, failure_limit=3)
'low-mean'
>>> should_trigger_paper(1, 0.8, 0.7, emitted=False)
True
"""
from __future__ import annotations

from .decision_trace import Trace
from .ledger import BranchLedger
from .policies.maxbandit import max_prune_reason, should_trigger_paper_max
from .settings import SchedulerSettings

__all__ = ["prune_reason", "should_trigger_paper", "prune_reason_vector",
           "should_trigger_paper_vector", "prune_gate", "paper_gate"]


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


def prune_gate(s: SchedulerSettings, led: BranchLedger, i: int, trace: Trace | None) -> str | None:
    """Why branch ``i`` is pruned after one of its outcomes under settings ``s``, or ``None``.

    >>> from dask_research.experiments import Hypothesis
    >>> from dask_research.experiments.settings import SchedulerSettings
    >>> led = BranchLedger(c=1.0)
    >>> _ = led.add([Hypothesis(f"a{k}", "a") for k in range(3)])
    >>> for _ in range(3):
    ...     i = led.record_failure(led.pop(0))
    >>> prune_gate(SchedulerSettings.parse(failure_limit=3), led, i, None)
    'failures'
    """
    runs, failures = int(led.runs[i]), int(led.failures[i])
    if s.objective == "max" and i in led.revived:    # brought back to spend the budget
        limit = s.failure_limit
        return "failures" if limit is not None and failures >= limit else None
    if s.objective == "max":
        pol = led.policy
        kept = getattr(pol, "sorted", None)
        if kept is not None and i < len(kept):
            rewards = kept[i]
        else:          # a mean policy with objective="max": the rewards are in the trace
            rewards = sorted(_rewards(trace, led.branches[i]))
        high = 1.0 if s.bounded else max(led.best_seen, 1.0)
        return max_prune_reason(i, rewards, led.best_seen, led.holder, runs, failures,
                                float(led.total_n), s.max_quantile, s.max_c,
                                s.prune_after_runs, s.failure_limit, high)
    if isinstance(s.prune_floor, dict):
        return prune_reason_vector(runs, led.raw_means(i) or {}, failures, s.prune_after_runs,
                                   s.prune_floor, s.objectives or {}, s.failure_limit)
    mean = float(led.mean[i]) if runs else float("nan")
    return prune_reason(runs, mean, failures, s.prune_after_runs, s.prune_floor,
                        s.failure_limit)


def paper_gate(s: SchedulerSettings, led: BranchLedger, i: int) -> bool:
    """Whether branch ``i`` triggers the paper stage now (once per branch).

    >>> from dask_research.experiments import ExperimentResult, Hypothesis
    >>> from dask_research.experiments.settings import SchedulerSettings
    >>> led = BranchLedger(c=1.0)
    >>> _ = led.add([Hypothesis("a1", "a")])
    >>> i = led.record(ExperimentResult(led.pop(0), 0.9))
    >>> paper_gate(SchedulerSettings.parse(paper_threshold=0.8), led, i)
    True
    """
    emitted = bool(led.paper[i])
    if s.objective == "max":
        return should_trigger_paper_max(float(led.best[i]), led.best_seen,
                                        float(s.paper_threshold), emitted)
    runs = int(led.runs[i])
    if isinstance(s.paper_threshold, dict):
        return should_trigger_paper_vector(runs, led.raw_means(i) or {}, s.paper_threshold,
                                           s.objectives or {}, emitted)
    return should_trigger_paper(runs, float(led.mean[i]), s.paper_threshold, emitted)


def _rewards(trace: Trace | None, branch: str) -> list[float]:
    if trace is None:
        return []
    return [float(ev.data["reward"]) for ev in trace._events
            if ev.kind == "result" and ev.branch == branch]
