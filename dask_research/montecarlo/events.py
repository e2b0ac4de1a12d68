"""Monte-Carlo events on the Dask event log (topic ``research.montecarlo``).

Every run says what happens to its shards: ``start``, ``accepted`` (a block of shards, with a
running estimate), ``check`` (a verification), ``quarantine``, ``speculate``, ``done``. The
events go to the scheduler's event log, so the dashboard's Shards page and any subscriber
(``client.subscribe_topic("research.montecarlo", handler)``) see every run on that scheduler,
whoever started it. They carry indices, worker addresses and numbers, never inputs, payloads
or store credentials.

Examples
--------
>>> from dask_research.montecarlo.events import RunningEstimate
>>> est = RunningEstimate()
>>> est.add(n=100, mean=1.0, m2=99.0)
>>> est.add(n=100, mean=3.0, m2=99.0)
>>> est.n, est.mean
(200, 2.0)
"""
from __future__ import annotations

import logging
import math
from typing import Any

from .. import config

logger = logging.getLogger(__name__)

__all__ = ["emit", "RunningEstimate", "topic"]


def topic() -> str:
    return str(config.get("montecarlo.event-topic"))


def emit(client, kind: str, run_id: str, **data: Any) -> None:
    """Log one event; never fails the run (a missing scheduler only costs the event)."""
    if client is None:
        return
    msg = {"event": kind, "run": run_id, **data}
    try:
        client.log_event(topic(), msg)
    except Exception as e:  # pragma: no cover - e.g. a scheduler going away mid-run
        logger.debug("could not log %s event: %s", kind, e)


class RunningEstimate:
    """Display-only running mean and stderr over blocks in arrival order (Chan merge)."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, n: int, mean: float, m2: float) -> None:
        if n <= 0:
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total

    @property
    def stderr(self) -> float:
        if self.n < 2:
            return math.nan
        return math.sqrt(self.m2 / (self.n - 1) / self.n)
