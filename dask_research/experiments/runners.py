"""Shipped runners and expanders: deterministic ones for tests, examples and benchmarks.

Examples
--------
>>> import asyncio
>>> from dask_research.experiments import Hypothesis, make_deterministic_runner
>>> run = make_deterministic_runner({"a": 0.9, "h7": 0.1}, delay_ms=0)
>>> asyncio.run(run(Hypothesis("h1", "a"))).reward      # by branch
0.9
>>> asyncio.run(run(Hypothesis("h7", "a"))).reward      # a hypothesis id wins over its branch
0.1
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping

from .. import config
from ..exceptions import ExperimentError
from .types import ExperimentResult, Hypothesis

__all__ = ["make_deterministic_runner", "make_followup_expander", "deterministic_expander"]

Rewards = Mapping[str, float] | Callable[[Hypothesis], float]


class DeterministicRunner:
    """``async`` runner with a fixed reward per hypothesis id or branch; see
    :func:`make_deterministic_runner`. Picklable, so it also runs on Dask workers."""

    def __init__(self, rewards: Rewards, delay_ms: float, default: float | None,
                 fail: Collection[str]):
        self.rewards = rewards
        self.delay_ms = float(delay_ms)
        self.default = default
        self.fail = frozenset(fail)

    def reward(self, h: Hypothesis) -> float:
        """The reward ``h`` will get."""
        if callable(self.rewards):
            return float(self.rewards(h))
        if h.id in self.rewards:
            return float(self.rewards[h.id])
        if h.branch in self.rewards:
            return float(self.rewards[h.branch])
        if self.default is not None:
            return float(self.default)
        raise KeyError(f"no reward for hypothesis {h.id!r} or branch {h.branch!r}")

    async def __call__(self, h: Hypothesis) -> ExperimentResult:
        t0 = time.perf_counter()
        if self.delay_ms > 0:
            await asyncio.sleep(self.delay_ms / 1000)
        if h.id in self.fail or h.branch in self.fail:
            raise RuntimeError(f"deterministic failure of {h.id!r} (branch {h.branch!r})")
        return ExperimentResult(h, self.reward(h), {"delay_ms": self.delay_ms},
                                time.perf_counter() - t0)

    def __repr__(self) -> str:
        return f"DeterministicRunner(delay_ms={self.delay_ms:g})"


def make_deterministic_runner(
    rewards: Rewards,
    delay_ms: float = 5,
    default: float | None = None,
    fail: Collection[str] = (),
) -> DeterministicRunner:
    """An ``async`` runner with predictable rewards that sleeps ``delay_ms`` per experiment.

    Parameters
    ----------
    rewards : mapping or callable
        ``{hypothesis id or branch: reward}`` (an id wins over its branch), or a function
        ``Hypothesis -> reward``.
    delay_ms : float
        Milliseconds each experiment sleeps (``asyncio.sleep``), so concurrency is visible.
    default : float, optional
        Reward for hypotheses the mapping does not name; without it they fail with KeyError.
    fail : collection of str
        Hypothesis ids or branches whose experiments raise ``RuntimeError`` (after the delay).

    Examples
    --------
    >>> run = make_deterministic_runner({"good": 0.8, "bad": 0.1}, delay_ms=5)
    >>> run
    DeterministicRunner(delay_ms=5)
    """
    if delay_ms < 0:
        raise ExperimentError(f"delay_ms={delay_ms!r} is invalid; expected a number >= 0",
                              delay_ms=delay_ms)
    return DeterministicRunner(rewards, delay_ms, default, fail)


class FollowupExpander:
    """Pure expander: ``fanout`` follow-ups for each result above ``threshold``; see
    :func:`make_followup_expander`."""

    def __init__(self, threshold: float | None, fanout: int, max_generation: int):
        self.threshold = threshold
        self.fanout = fanout
        self.max_generation = max_generation

    def __call__(self, result: ExperimentResult) -> list[Hypothesis]:
        threshold = config.resolve("experiments.paper-threshold", self.threshold)
        h = result.hypothesis
        if not result.ok or result.reward <= threshold or h.generation >= self.max_generation:
            return []
        return [h.followup(f".{k + 1}") for k in range(self.fanout)]

    def __repr__(self) -> str:
        return (f"FollowupExpander(threshold={self.threshold}, fanout={self.fanout}, "
                f"max_generation={self.max_generation})")


def make_followup_expander(
    threshold: float | None = None, fanout: int = 2, max_generation: int = 1
) -> FollowupExpander:
    """Expander adding ``fanout`` follow-ups on the same branch for every high-reward result.

    A result whose reward exceeds ``threshold`` (default: ``research.experiments.paper-threshold``,
    read at call time) gets follow-ups ``<id>.1 ... <id>.<fanout>`` with the same payload,
    ``parent`` set and ``generation + 1``. Follow-ups of generation ``max_generation`` are not
    expanded further, so the queue cannot grow forever.

    Examples
    --------
    >>> from dask_research.experiments import Hypothesis, Result
    >>> expand = make_followup_expander(threshold=0.7)
    >>> [h.id for h in expand(Result(Hypothesis("h1", "a"), 0.9))]
    ['h1.1', 'h1.2']
    >>> expand(Result(Hypothesis("h1.1", "a", generation=1), 0.9))
    []
    """
    if fanout < 0 or max_generation < 0:
        raise ExperimentError(
            f"fanout={fanout!r}, max_generation={max_generation!r} are invalid; expected "
            "integers >= 0", fanout=fanout, max_generation=max_generation)
    return FollowupExpander(threshold, int(fanout), int(max_generation))


#: The shipped deterministic expander: two follow-ups for every result above the paper
#: threshold (read from ``research.experiments.paper-threshold`` when it runs), one generation.
deterministic_expander = make_followup_expander()
