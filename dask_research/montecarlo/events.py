"""Monte-Carlo events on the Dask event log (topic ``research.montecarlo``).

Every run says what happens to its shards: ``start`` (with the client's id, so a page can tell
a run whose client left), ``accepted`` (a block of shards, with a running estimate), ``check``
(a verification), ``check-moved`` (a late or failed check submitted elsewhere),
``quarantine``, ``speculate``, ``speculate-stopped``, ``retry`` (a block that failed on one
worker, submitted on another), ``done``, or ``failed`` (with its reason, one line). The
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

import asyncio
import logging
import math
import threading
from collections import deque
from typing import Any

from .. import config

logger = logging.getLogger(__name__)

__all__ = ["EventOutbox", "RunningEstimate", "topic"]


def topic() -> str:
    return str(config.get("montecarlo.event-topic"))


class EventOutbox:
    """Ordered, fire-and-forget events of one run, shipped from the client's event loop.

    A run emits an event per accepted block, and the driver should not wait for the
    scheduler's reply each time (``client.log_event`` is a synchronous round trip). The outbox
    queues messages and one coroutine on the client's loop sends them one after the other, so
    they arrive in the order they were emitted, ``done`` last. :meth:`flush` waits until every
    queued message has been sent (a run flushes before it returns, so its events are in the
    log when the caller reads them). A failure only costs the event, never the run.

    Examples
    --------
    >>> box = EventOutbox(None)          # no client: events are dropped
    >>> box.emit("start", "run-id", shards=4)
    >>> box.flush()
    """

    def __init__(self, client) -> None:
        self.client = client
        self._queue: deque[dict] = deque()
        self._lock = threading.Lock()
        self._shipping: Any = None          # concurrent.futures.Future of the running shipper

    def emit(self, kind: str, run_id: str, **data: Any) -> None:
        """Queue ``{"event": kind, "run": run_id, **data}``; returns at once."""
        if self.client is None:
            return
        with self._lock:
            self._queue.append({"event": kind, "run": run_id, **data})
            if self._shipping is None:
                try:
                    self._shipping = asyncio.run_coroutine_threadsafe(self._ship(topic()),
                                                                      self.client.loop.asyncio_loop)
                except Exception as e:  # pragma: no cover - a client without a running loop
                    self._queue.clear()
                    logger.debug("could not ship %s event: %s", kind, e)

    async def _ship(self, topic_: str) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._shipping = None
                    return
                batch = list(self._queue)
                self._queue.clear()
            for msg in batch:
                try:
                    await self.client.scheduler.log_event(topic=topic_, msg=msg)
                except Exception as e:  # pragma: no cover - e.g. a scheduler going away mid-run
                    logger.debug("could not log %s event: %s", msg.get("event"), e)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued event has been sent (at most ``timeout`` seconds)."""
        with self._lock:
            shipping = self._shipping
        if shipping is None:
            return
        try:
            shipping.result(timeout)
        except Exception as e:  # pragma: no cover - the log is best effort
            logger.debug("events not flushed: %s", e)


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
