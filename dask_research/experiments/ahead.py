"""Queue-ahead: a decided experiment waits behind each running one, so a slot never idles.

Without it a slot idles for one round trip per experiment: the result travels from the worker
to the scheduler and the driver, the driver decides, and the next experiment travels back to
the scheduler and a worker. With ``queue_ahead=1`` (``research.experiments.queue-ahead``) the
driver keeps one more decided experiment per slot in flight; on a Dask cluster it waits on a
worker (or at the scheduler, or in the slot's actor with ``transport="actors"``) and starts the
moment a thread frees, without the driver. The price is information: a queued decision is made
without the results of the experiments running when it was made, like one more slot of
parallelism.

``"auto"`` (the default) queues ahead only where that costs no information or where the round
trip is worth hiding, on a Dask cluster:

- **forced picks**, from the very first decision: while the policy's next pick does not depend
  on results. UCB1, UCB1-tuned, KL-UCB, discounted UCB and the max-bandit policies score every
  untried branch (no results, nothing in flight) above every other and take the first such
  (:attr:`~.policies.Policy.untried_first`); while an eligible untried branch remains, the next
  pick is that branch whatever the experiments in flight return (unless one of them fails on a
  branch that has no result yet, which makes that branch untried again). Such a decision is the
  same made now or after the results, so it is queued ahead at once;
- **the measured gap**, after the first results: once the idle gap per experiment (time from
  dispatch to result, less the experiment's own duration) exceeds ``queue_ahead_gap`` (1 %) of
  the experiments' typical duration. Hour-long experiments keep fully informed decisions;
  experiments of a few seconds or less stop idling.

Without a client the slot is refilled inside the finished task, so ``"auto"`` never queues ahead
there. With ``apply_order="dispatch"``, whose decisions must not depend on timing, only forced
picks are queued (they depend on the decisions made so far alone: the run is as deterministic as
without queue-ahead, and makes the same decisions unless an experiment fails on a branch with no
result yet); a number, ``queue_ahead=1``, applies everywhere and is
deterministic.

Examples
--------
>>> rule = AheadRule("auto", gap_fraction=0.01)
>>> rule.depth()                      # nothing measured yet: fully informed decisions
0
>>> for _ in range(4):
...     rule.observe(gap=0.004, duration=0.05)     # 4 ms idle per 50 ms experiment: 8 %
>>> rule.depth()
1
>>> hour = AheadRule("auto", gap_fraction=0.01)
>>> hour.observe(gap=0.004, duration=3600.0)
>>> hour.depth()
0
>>> AheadRule(2, gap_fraction=0.01).depth()      # a number is kept as given
2
>>> AheadRule("auto", gap_fraction=0.01).depth(forced=True)   # the next pick is forced
1
"""
from __future__ import annotations

import statistics
from collections import deque

__all__ = ["AheadRule", "worth_queueing"]

#: Experiments whose gap and duration the ``"auto"`` rule remembers (the most recent).
WINDOW = 16


def worth_queueing(gaps: list[float], durations: list[float], gap_fraction: float) -> bool:
    """The ``"auto"`` rule: is the median idle gap per experiment more than ``gap_fraction``
    of the median experiment duration? ``False`` while either is unmeasured.

    >>> worth_queueing([0.003, 0.005], [0.5, 0.5], 0.01)     # 4 ms of 500 ms: 0.8 %
    False
    >>> worth_queueing([0.006, 0.008], [0.5, 0.5], 0.01)     # 7 ms of 500 ms: 1.4 %
    True
    >>> worth_queueing([], [0.5], 0.01)
    False
    """
    if not gaps or not durations:
        return False
    return statistics.median(gaps) > gap_fraction * statistics.median(durations)


class AheadRule:
    """How many decided experiments to keep queued behind each running one.

    ``setting`` is an integer (kept as given) or ``"auto"``; :meth:`observe` feeds the auto rule
    the idle gap of an experiment that started on a free slot (``None`` when unknown: it was
    queued) and every experiment's duration; :meth:`depth` is 0 or 1 under ``"auto"``.
    ``enabled=False``: a backend with no round trip to hide (never queue under ``"auto"``);
    ``timed=False``: decisions must not depend on timing (``apply_order="dispatch"``), so only
    forced picks are queued.
    """

    def __init__(self, setting: int | str, gap_fraction: float, enabled: bool = True,
                 timed: bool = True) -> None:
        self.setting = setting
        self.gap_fraction = gap_fraction
        self.enabled = enabled            # False: a backend that never queues under "auto"
        self.timed = timed                # False: only forced picks are queued under "auto"
        self.gaps: deque[float] = deque(maxlen=WINDOW)
        self.durations: deque[float] = deque(maxlen=WINDOW)

    @property
    def auto(self) -> bool:
        return self.setting == "auto"

    def observe(self, gap: float | None, duration: float | None) -> None:
        """Record one finished experiment (negative gaps, from clock noise, count as 0)."""
        if gap is not None:
            self.gaps.append(max(0.0, gap))
        if duration is not None and duration >= 0:
            self.durations.append(duration)

    def depth(self, forced: bool = False) -> int:
        """Experiments to keep queued per running one now; ``forced``: the next pick does not
        depend on results (see the module's docstring)."""
        if not self.auto:
            return int(self.setting)
        if not self.enabled:
            return 0
        if forced:
            return 1
        if not self.timed:
            return 0
        return int(worth_queueing(list(self.gaps), list(self.durations), self.gap_fraction))
