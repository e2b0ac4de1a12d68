"""What a run maximises: ``objective="mean"`` (a branch's average reward) or ``"max"``.

``"mean"`` is the classic bandit objective: the scheduler spends its budget on the branch with
the best average, prunes a branch whose mean stays below ``prune_floor`` and triggers the paper
stage when a branch's mean exceeds ``paper_threshold``.

``"max"`` is the objective of a search (hyperparameters, designs, prompts) that keeps only its
best result: the scheduler looks for the branch most likely to produce the best single reward,
with a max-bandit policy (:mod:`.maxbandit`); a branch is pruned when its upper bound on the
``tau``-quantile falls below the best reward seen elsewhere (never for low means, so one
catastrophic draw does not bury a family), and the paper stage is triggered by a branch whose
result is the best so far and above ``paper_threshold``; ``report.best`` is then the branch of
the best result.

This module holds the gate decisions of ``"max"`` for the driver (:mod:`.loop`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import InputError
from .maxbandit import max_prune_reason, should_trigger_paper_max

if TYPE_CHECKING:
    from .loop import IterationScheduler

__all__ = ["OBJECTIVES", "check_objective", "max_prune", "max_trigger"]

OBJECTIVES = ("mean", "max")


def check_objective(value: object) -> str:
    """``value`` if it is a known objective, else :class:`InputError`."""
    if value not in OBJECTIVES:
        raise InputError("objective", value, '"mean" (average reward of a branch) or "max" '
                         "(best single result of a branch)", where="IterationScheduler")
    return str(value)


def max_prune(sched: IterationScheduler, i: int) -> str | None:
    """The pruning gate of ``objective="max"`` for branch ``i`` after one of its outcomes."""
    led = sched.ledger
    pol = led.policy
    sorted_rewards = pol.sorted[i] if hasattr(pol, "sorted") and i < len(pol.sorted) else \
        sorted(_rewards(sched, i))
    high = 1.0 if sched.bounded else max(led.best_seen, 1.0)
    return max_prune_reason(i, sorted_rewards, led.best_seen, led.holder, int(led.runs[i]),
                            int(led.failures[i]), float(led.total_n), sched.max_quantile,
                            sched.max_c, sched.prune_after_runs, sched.failure_limit, high)


def _rewards(sched: IterationScheduler, i: int) -> list[float]:
    """Rewards of branch ``i`` when the policy does not keep them (a mean policy with
    ``objective="max"``): read from the trace."""
    name = sched.ledger.branches[i]
    trace = sched._trace
    if trace is None:
        return []
    return [float(ev.data["reward"]) for ev in trace._events
            if ev.kind == "result" and ev.branch == name]


def max_trigger(sched: IterationScheduler, i: int) -> bool:
    """The paper gate of ``objective="max"``: the branch's best is the best so far and above
    ``paper_threshold`` (once per branch)."""
    led = sched.ledger
    return should_trigger_paper_max(float(led.best[i]), led.best_seen,
                                    float(sched.paper_threshold),  # type: ignore[arg-type]
                                    bool(led.paper[i]))
