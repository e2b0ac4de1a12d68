"""Monte-Carlo events on the Dask event log (topic ``research.montecarlo.event-topic``).

Every run says what happens to its shards: ``start`` (with the client's id, so a page can tell
a run whose client left), ``accepted`` (a block of shards, with a running estimate), ``check``
(a verification), ``check-moved`` (a late or failed check submitted elsewhere),
``quarantine``, ``speculate``, ``speculate-stopped``, ``rescue`` (a stuck block copied),
``group-opened`` (a group answered block by block), ``retry`` (a block that failed on one
worker, submitted on another), ``done``, or ``failed`` (with its reason, one line). The
events go to the scheduler's event log in the envelope of :mod:`dask_research.events`, one log
entry each, so the dashboard's Shards page and any subscriber
(``client.subscribe_topic("research.montecarlo", handler)``) see every run on that scheduler,
whoever started it. They carry indices, worker addresses and numbers, never inputs, payloads
or store credentials.

Examples
--------
>>> from dask_research.montecarlo.run_events import RunningEstimate
>>> est = RunningEstimate()
>>> est.add(n=100, mean=1.0, m2=99.0)
>>> est.add(n=100, mean=3.0, m2=99.0)
>>> est.n, est.mean
(200, 2.0)
"""
from __future__ import annotations

import math
from typing import Any

from .. import events

__all__ = ["EventOutbox", "RunningEstimate", "topic"]


def topic() -> str:
    """The Monte-Carlo topic, ``research.montecarlo.event-topic``.

    >>> topic()
    'research.montecarlo'
    """
    return events.topic("montecarlo")


class EventOutbox(events.Outbox):
    """The ordered outbox of one run's events (:class:`dask_research.events.Outbox`).

    A run emits an event per accepted block, and the driver does not wait for the scheduler
    each time: :meth:`emit` queues, and everything queued while a shipment is in flight goes
    to the scheduler in one round trip, each event its own log entry, in emission order,
    ``done`` last. :meth:`flush` waits until every queued message has been sent (a run flushes
    before it returns, so its events are in the log when the caller reads them). A failure
    only costs the events, never the run.

    Examples
    --------
    >>> box = EventOutbox(None)          # no client: events are dropped
    >>> box.emit("start", "run-id", shards=4)
    >>> box.flush()
    True
    """

    def __init__(self, client: Any) -> None:
        super().__init__(client, "montecarlo")


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
