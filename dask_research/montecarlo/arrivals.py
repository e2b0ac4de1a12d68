"""Waiting for a run's tasks to end, and fetching what they hold, without waiting without a bound.

Every submitted future is added to one :class:`distributed.as_completed` on the client's loop,
whose async iteration wakes the driver when one ends: constant work per future, where waiting
on every pending future at each turn of the driver cost a coroutine per future in flight per
turn. What has ended is read from the futures' own status at each turn, so a future that ends,
loses its data with its worker and ends again is seen again.

A worker frozen (SIGSTOP) after it finished a task holds the result without answering: results
are gathered with a bound, then one by one, and what cannot be fetched stays pending; it is tried
again later with twice the bound (a large state on a slow network is fetched in the end).

>>> Arrivals(None, bound=lambda: 1.0).waitable([])
[]
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Arrivals"]


class Arrivals:
    """The ends of one kind of a run's tasks (its blocks, or its checks).

    ``bound()`` is the seconds a gather may take; ``on_unfetched(key, now)`` is told of a
    finished future whose result could not be fetched in time.

    >>> arrivals = Arrivals(None, bound=lambda: 1.0)
    >>> arrivals.unfetched
    {}
    """

    def __init__(self, client: Any, bound: Callable[[], float],
                 on_unfetched: Callable[[str, float], None] | None = None):
        self.client, self.bound, self.on_unfetched = client, bound, on_unfetched
        self.unfetched: dict[str, tuple[float, float]] = {}  # key -> (when a fetch timed out, its bound)
        self._ended: Any = None        # a distributed.as_completed, made on the first track()

    def track(self, futures: list) -> None:
        """Wake :meth:`collect` when any of ``futures`` ends (each once)."""
        if self._ended is None:
            from distributed import as_completed

            self._ended = as_completed(loop=self.client.loop)
        self._ended.update(futures)

    def waitable(self, futures: list) -> list:
        """``futures`` less those whose result could not be fetched a moment ago."""
        if not self.unfetched:
            return list(futures)
        now = time.monotonic()
        return [f for f in futures if f.key not in self.unfetched
                or now - self.unfetched[f.key][0] >= self.unfetched[f.key][1]]

    def collect_sync(self, futures: list, timeout: float) -> tuple[list, dict]:
        """:meth:`collect` from the driver's thread."""
        return self.client.sync(self.collect, futures, timeout)

    async def _first_done(self, futures: list, timeout: float) -> list:
        """The ended ones of ``futures`` (all tracked), waiting up to ``timeout`` for one."""
        ended = self._ended
        if ended is not None:
            ended.next_batch(block=False)          # seen through the status below; drop the references
        ready = [f for f in futures if f.done()]
        if ready or ended is None:
            return ready
        try:                                       # nothing runs on this loop between the check and the wait
            await asyncio.wait_for(anext(ended), timeout)
        except asyncio.TimeoutError:
            return []
        except StopAsyncIteration:                 # every tracked future already ended once: poll
            await asyncio.sleep(timeout)
        ended.next_batch(block=False)
        return [f for f in futures if f.done()]

    async def collect(self, futures: list, timeout: float) -> tuple[list, dict]:
        """Wait for the first of ``futures`` to end, then gather every finished one: one hop.

        Returns the ended futures (finished, errored, cancelled: less those whose result could
        not be fetched) and the fetched results by future.
        """
        futures = self.waitable(futures)
        if not futures:
            await asyncio.sleep(timeout)
            return [], {}
        done = await self._first_done(futures, timeout)
        if not done:
            return [], {}
        finished = [f for f in done if f.status == "finished"]
        if not finished:
            return list(done), {}
        bound = self.bound()
        try:
            values = await asyncio.wait_for(self.client.gather(finished, asynchronous=True), bound)
            for f in finished:
                self.unfetched.pop(f.key, None)
            return list(done), dict(zip(finished, values))   # done also holds errored and lost futures
        except asyncio.TimeoutError:
            pass
        bounds = [2 * self.unfetched[f.key][1] if f.key in self.unfetched else bound for f in finished]
        got = await asyncio.gather(*(asyncio.wait_for(self.client.gather([f], asynchronous=True), b)
                                     for f, b in zip(finished, bounds)), return_exceptions=True)
        values_by = {f: v[0] for f, v in zip(finished, got) if isinstance(v, list)}
        now = time.monotonic()
        for f, b in zip(finished, bounds):
            if f in values_by:
                self.unfetched.pop(f.key, None)
            else:
                self.unfetched[f.key] = (now, b)
                if self.on_unfetched is not None:
                    self.on_unfetched(f.key, now)
        return [f for f in done if f in values_by or f.status != "finished"], values_by
