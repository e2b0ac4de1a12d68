"""Waiting for a run's tasks to end, and fetching what they hold, without waiting without a bound.

Every submitted future is added to one :class:`distributed.as_completed` on the client's loop,
whose async iteration wakes the driver when one ends (the public API; it replaced a coroutine
per future awaiting ``distributed.client._wait``, and costs the client less, see
``benchmarks/bench_montecarlo_scale.py --wake``). A turn of the driver looks at the futures
that ended, never at every future in flight. One that ended but was not consumed (its result
could not be fetched yet; it finished, lost its data with its worker and is being recomputed)
is read again by its status at every turn until it is.

A worker frozen (SIGSTOP) after it finished a task holds the result without answering: results
are gathered with a bound, then one holding worker at a time (Dask merges concurrent gathers,
so a frozen holder would hold everyone's results with its own), and what cannot be fetched
stays pending; it is tried again later with twice the bound (a large state on a slow network
is fetched in the end), never more than :func:`bound_cap`: half of Dask's connect timeout.
Fetches run beside the driver's turns, not in them (:meth:`Arrivals.collect`): a holder that
does not answer delays its own results, never the driver's look at everything else (it went
still for the gather's bound twice over in a turn, and a worker behind a partition for twice
the block timeout then had its running blocks rescued in no turn at all).
A longer wait lets Dask's own gather give up on the frozen holder first, and Dask then reports
the key lost ("Couldn't gather ... rescheduling") and the scheduler recomputes it wherever it
likes, on the frozen worker as likely as not; the run then waited for that worker (a grouped
run under heavy load, where the bounds had doubled past 30 s).

>>> from distributed import Client, LocalCluster
>>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
...         Client(cluster, set_as_default=False) as client:
...     arrivals = Arrivals(client, bound=lambda: 30.0)
...     futures = client.map(abs, [-1, -2, -3], pure=False)
...     arrivals.track(futures)
...     got: dict = {}
...     while len(got) < 3:                     # each turn: the first to end, and every one finished
...         done, values = arrivals.collect_sync({f for f in futures if f not in got}, 1.0)
...         got.update(values)
>>> sorted(got.values())
[1, 2, 3]
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Container
from typing import Any

from .._compat import FutureCancelledError, FuturesCancelledError, scheduler_call

__all__ = ["Arrivals", "bound_cap"]


def bound_cap() -> float:
    """The longest a gather may wait: half of ``distributed.comm.timeouts.connect``, so the run's
    own bound, not Dask's connect timeout, ends a gather from a frozen worker.

    >>> import dask
    >>> with dask.config.set({"distributed.comm.timeouts.connect": "30s"}):
    ...     bound_cap()
    15.0
    """
    import dask
    from dask.utils import parse_timedelta

    return 0.5 * float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="s"))


class Arrivals:
    """The ends of one kind of a run's tasks (its blocks, or its checks).

    ``bound()`` is the seconds a gather may take; ``on_unfetched(key, now)`` is told of a
    finished future whose result could not be fetched in time (:attr:`holders` then says which
    worker held it, where the scheduler said).

    A driver turn costs the futures that ended since the last turn, not the futures in flight:
    the ended ones come from the ``as_completed``; those that ended but were not consumed (a
    result that could not be fetched, a block that finished and then lost its data with its
    worker) are read again by their status at each turn until they are.

    See the module's example; :meth:`suspects` shows what a frozen holder leaves behind.
    """

    def __init__(self, client: Any, bound: Callable[[], float],
                 on_unfetched: Callable[[str, float], None] | None = None):
        self.client, self.bound, self.on_unfetched = client, bound, on_unfetched
        self.unfetched: dict[str, tuple[float, float]] = {}  # key -> (when a fetch timed out, its bound)
        self.holders: dict[str, list] = {}  # key -> the workers that held it when it could not be fetched
        self._completed: Any = None    # a distributed.as_completed, made on the first track()
        self._ended: dict[Any, None] = {}   # futures that ended and were not consumed yet, in order
        self._fetching: dict[asyncio.Future, list] = {}   # fetches in flight -> the futures each fetches
        self._in_fetch: set = set()         # the futures being fetched

    def track(self, futures: list) -> None:
        """Wake :meth:`collect` when any of ``futures`` ends (each once)."""
        if self._completed is None:
            from distributed import as_completed

            self._completed = as_completed(loop=self.client.loop)
        self._completed.update(futures)

    def waitable(self, futures: list) -> list:
        """``futures`` less those whose result could not be fetched a moment ago."""
        if not self.unfetched:
            return list(futures)
        now = time.monotonic()
        return [f for f in futures if f.key not in self.unfetched
                or now - self.unfetched[f.key][0] >= self.unfetched[f.key][1]]

    def collect_sync(self, wanted: Container, timeout: float) -> tuple[list, dict]:
        """:meth:`collect` from the driver's thread."""
        return self.client.sync(self.collect, wanted, timeout)

    def _take_ended(self) -> None:
        if self._completed is not None:
            for f in self._completed.next_batch(block=False):
                self._ended[f] = None

    def _ready(self, wanted: Container) -> list:
        """The ended futures among ``wanted`` that can be consumed now; forget the unwanted."""
        ready = []
        for f in list(self._ended):
            if f not in wanted:
                del self._ended[f]             # accepted elsewhere (a twin), or no longer the caller's
            elif f.done() and f not in self._in_fetch:
                ready.append(f)
        return self.waitable(ready)

    async def _first_done(self, wanted: Container, timeout: float) -> list:
        """The ended ones of ``wanted`` (all tracked), waiting up to ``timeout`` for one."""
        self._take_ended()
        ready = self._ready(wanted)
        if ready or self._completed is None:
            return ready
        if self._fetching:                     # a fetch that ends wakes the wait too
            nxt = asyncio.ensure_future(anext(self._completed))
            woke, _ = await asyncio.wait([nxt, *self._fetching], timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if nxt not in woke:
                nxt.cancel()
            elif nxt.exception() is None:
                self._ended[nxt.result()] = None
            else:                              # every tracked future already ended once: wait on the fetches
                await asyncio.wait(list(self._fetching), timeout=timeout)
            self._take_ended()
            return self._ready(wanted)
        try:                                   # nothing runs on this loop between the check and the wait
            self._ended[await asyncio.wait_for(anext(self._completed), timeout)] = None
        except asyncio.TimeoutError:
            return []
        except StopAsyncIteration:             # every tracked future already ended once: poll
            await asyncio.sleep(timeout)
        self._take_ended()
        return self._ready(wanted)

    async def _by_holder(self, finished: list, bounds: dict) -> dict:
        """Gather ``finished`` one holding worker at a time, each with its bound; what came.

        Dask merges gathers that are in flight together into one request, so a worker that
        holds some results without answering (frozen) would hold every other result with it:
        the results are grouped by the worker that holds them (the scheduler's ``who_has``) and
        fetched group after group.
        """
        try:
            who = await asyncio.wait_for(scheduler_call(self.client, "who_has", keys=[f.key for f in finished]),
                                         min(bounds.values()))
        except Exception:  # noqa: BLE001 - no answer: one group per future, as if each had its own holder
            who = {}
        groups: dict[Any, list] = {}
        for f in finished:
            holders = sorted((who or {}).get(f.key) or ())
            if holders:
                self.holders[f.key] = holders
            groups.setdefault(holders[0] if holders else f.key, []).append(f)
        values_by: dict = {}
        for futs in groups.values():
            try:
                values = await asyncio.wait_for(self.client.gather(futs, asynchronous=True),
                                                max(bounds[f] for f in futs))
            except Exception:  # noqa: BLE001 - not fetched now (a timeout, a result lost meanwhile)
                continue
            values_by.update(zip(futs, values))
        return values_by

    def outstanding(self, fut: Any) -> bool:
        """Whether ``fut`` has not returned: running, waiting, or finished with a result that
        could not be fetched in time. A finished one whose fetch is in flight (or not begun)
        has returned: its result is on its way, and the fetch has its own bound."""
        return fut.status != "finished" or fut.key in self.unfetched

    def suspects(self) -> set[str]:
        """Workers that hold results that cannot be fetched: the ones every such result has in
        common (a result copied to a frozen worker is held by a good one too), else all of them.

        >>> a = Arrivals(None, bound=lambda: 1.0)
        >>> a.unfetched = {"x": (0.0, 1.0), "y": (0.0, 1.0)}
        >>> a.holders = {"x": ["tcp://frozen", "tcp://good"], "y": ["tcp://frozen"]}
        >>> a.suspects()
        {'tcp://frozen'}
        """
        sets = [set(self.holders[k]) for k in self.unfetched if self.holders.get(k)]
        if not sets:
            return set()
        common = set.intersection(*sets)
        return common or set.union(*sets)

    async def collect(self, wanted: Container, timeout: float) -> tuple[list, dict]:
        """Wait for the first tracked future in ``wanted`` to end, then fetch every finished one.

        ``wanted``: the futures the caller waits for (a mapping or set: only membership is
        asked). Returns the ended ones (finished, errored, cancelled; less those whose result
        was not fetched) and the fetched results by future. What is returned is consumed: the
        caller acts on it now.

        A fetch runs beside the driver, not in its turn: this waits up to ``timeout`` for the
        one it starts (a few milliseconds, normally) and returns without it if it takes longer,
        so a holder that does not answer (frozen, or behind a partition) holds its own results
        for their bound, never the driver's turns: the run goes on timing, copying and
        accepting everything else. A later call takes what the fetch brought.
        """
        ended, values = self._harvest(wanted)
        if ended:
            self._take_ended()
            done = self._ready(wanted)
        else:
            done = await self._first_done(wanted, timeout)
        for f in done:
            if f.status != "finished":
                self._ended.pop(f, None)
        new = [f for f in done if f.status == "finished"]
        done = [f for f in done if f.status != "finished"]
        if new:
            task = asyncio.ensure_future(self._fetch(new))
            self._fetching[task] = new
            self._in_fetch.update(new)
            await asyncio.wait([task], timeout=timeout)
        more, got = self._harvest(wanted)
        values.update(got)
        return ended + done + more, values

    def _harvest(self, wanted: Container) -> tuple[list, dict]:
        """What the fetches that ended brought: the futures now consumed, and their results."""
        ended: list = []
        values: dict = {}
        for task in [t for t in self._fetching if t.done()]:
            futs = self._fetching.pop(task)
            self._in_fetch.difference_update(futs)
            got = task.result() if not task.cancelled() else {}
            for f in futs:
                if f in got:
                    self._ended.pop(f, None)
                    if f in wanted:
                        ended.append(f)
                        values[f] = got[f]
                elif f.status != "finished":    # cancelled or lost while it was fetched: say so now
                    if f.status in ("cancelled", "error"):
                        self._ended.pop(f, None)
                    # else lost (its data went with its worker, or Dask's gather reset it): it
                    # stays tracked and is fetched when it finishes again (``as_completed``
                    # reports a future once; dropped here, it was never fetched again)
                    if f in wanted:
                        ended.append(f)
        return ended, values

    async def _fetch(self, finished: list) -> dict:
        """The results of ``finished`` that could be fetched within their bounds, by future.

        One gather first (the common case: every holder answers); if it times out, one holding
        worker at a time (:meth:`_by_holder`), each result with twice the bound it last failed
        with. What cannot be fetched is recorded in :attr:`unfetched` and tried again after its
        bound. A future cancelled meanwhile is read from its status; any other error of the
        gather (a result that cannot be deserialized, say) is raised to the driver by the turn
        that takes this fetch.
        """
        cap = bound_cap()
        bound = min(self.bound(), cap)
        try:
            values = await asyncio.wait_for(self.client.gather(finished, asynchronous=True), bound)
            for f in finished:
                self.unfetched.pop(f.key, None)
            return dict(zip(finished, values))
        except asyncio.TimeoutError:
            pass
        except (FutureCancelledError, FuturesCancelledError):
            # Cancelled while it was fetched (from outside the run, or the scheduler is gone):
            # the caller reads the cancellation from the futures' status and says by whom.
            return {}
        bounds = [min(2 * self.unfetched[f.key][1], cap) if f.key in self.unfetched else bound for f in finished]
        values_by = await self._by_holder(finished, dict(zip(finished, bounds)))
        now = time.monotonic()
        for f, b in zip(finished, bounds):
            if f in values_by:
                self.unfetched.pop(f.key, None)
                self.holders.pop(f.key, None)
            elif f.status == "finished":
                self.unfetched[f.key] = (now, b)
                if self.on_unfetched is not None:
                    self.on_unfetched(f.key, now)
        return values_by

    @property
    def fetching(self) -> int:
        """How many fetches are in flight."""
        return len(self._fetching)

    async def close(self) -> None:
        """Stop the fetches in flight (the run ended: nothing waits for them)."""
        tasks = list(self._fetching)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetching.clear()
        self._in_fetch.clear()
