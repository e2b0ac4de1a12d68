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

The gate decisions of both objectives are in :mod:`.gates`.

>>> check_objective("max")
'max'
"""
from __future__ import annotations

from ..exceptions import InputError

__all__ = ["OBJECTIVES", "check_objective"]

OBJECTIVES = ("mean", "max")


def check_objective(value: object) -> str:
    """``value`` if it is a known objective, else :class:`InputError`."""
    if value not in OBJECTIVES:
        raise InputError("objective", value, '"mean" (average reward of a branch) or "max" '
                         "(best single result of a branch)", where="IterationScheduler")
    return str(value)
