"""Blocks in flight, watched: a hung block fails the run, a straggler near the end is copied.

Which block runs where is read from the scheduler at most once a second, near the end once per
``poll``. A block past the block timeout fails the run with a :class:`PipelineError` naming its
shards, worker and elapsed time. Near the end (nothing left to submit, every unfinished block
seen on a worker) a block running ``speculate`` median block times is copied to another worker:
at most one copy of a block, never of a block past half the block timeout (more likely hung than
slow), and none at all once a copy was as slow as its original (then the shards are slow, not
the worker).

>>> from dask_research.montecarlo.run_settings import RunSettings
>>> from dask_research.montecarlo.timing import Limits
>>> limits = Limits(block=4, settings=RunSettings.parse(block_timeout=10))
>>> s = Stragglers(None, limits, speculate=0.0, poll=0.2, bounds=[(0, 4)], emit=print)
>>> class Future:
...     key, status = "mc-block-t-0-4", "pending"
>>> block = Future()
>>> s.running[block.key] = (100.0, "tcp://w1")         # first seen running on tcp://w1 at 100 s
>>> s.check_hung(105.0, {block: 0}, {0: [block]})      # within the limit
>>> s.check_hung(111.0, {block: 0}, {0: [block]})
Traceback (most recent call last):
...
dask_research.exceptions.PipelineError: ...shard 0-3: did not return within 11.0 s on worker tcp://w1 ...
"""
from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Any

from ..exceptions import PipelineError
from .timing import Limits, RunningMedian

__all__ = ["RESCUES", "Stragglers"]

#: Copies of one block made because it was stuck (on a silent worker, or past half the block
#: timeout), at most: each goes to a worker the block has not run on.
RESCUES = 2


def _not_returned(fut: Any) -> bool:
    """Without an ``out`` predicate, every attempt in flight counts as not returned."""
    return True


class Stragglers:
    """When each pending block was first seen running, and on which worker; what to do about it.

    ``emit(kind, **data)`` sends a run event; ``bounds`` are the blocks' shard ranges.

    >>> from dask_research.montecarlo.timing import Limits
    >>> s = Stragglers(None, Limits(block=1), speculate=3.0, poll=0.2, bounds=[(0, 1)], emit=print)
    >>> s.unanswered("mc-block-x-0-1", 5.0)
    >>> s.running["mc-block-x-0-1"][1]
    'the worker holding its result (not answering)'
    """

    def __init__(self, client: Any, limits: Limits, *, speculate: float, poll: float,
                 bounds: list[tuple[int, int]], emit: Callable[..., None]):
        self.client, self.limits, self.speculate, self.poll = client, limits, speculate, poll
        self.bounds, self.emit = bounds, emit
        self.running: dict[str, tuple[float, str]] = {}   # key -> (first seen processing, worker)
        self.durations = RunningMedian()                 # seconds of every finished block
        self.end_seen: dict[int, float] = {}
        self.stopped = False                             # a copy was as slow as its original
        self.rescued: dict[int, int] = {}                # block -> copies made because it was stuck
        self._watched: float | None = None               # when client.processing() was last read (None: never)

    def unanswered(self, key: str, now: float, holder: str | None = None) -> None:
        """``key`` finished but its result cannot be fetched: time it like a block still running.

        ``holder``: the worker holding the result, where known; a copy then goes elsewhere.
        """
        self.running.setdefault(key, (now, holder or "the worker holding its result (not answering)"))

    def watch(self, now: float, pending: Mapping[Any, int], ending: bool = False) -> dict[str, str] | None:
        """Which pending key runs where, read from the scheduler at most once a second.

        Near the end (``ending``: nothing left to submit, stragglers matter) at most once per
        ``poll``. Records when each key was first seen processing (on which worker); ``None`` if
        not read this time.
        """
        limit = self.limits.block_limit()
        if limit is None and self.speculate <= 0:
            return None
        interval = self.poll if ending else min(1.0, (limit or 10.0) / 10)
        if self._watched is not None and now - self._watched < interval:
            return None
        self._watched = now
        where = {k: w for w, keys in self.client.processing().items() for k in keys}
        for f in pending:
            w = where.get(f.key)
            if w is None:
                continue
            seen = self.running.get(f.key)
            if seen is None or seen[1] != w:          # started, or rescheduled on another worker
                self.running[f.key] = (now, w)
        return where

    def check_hung(self, now: float, pending: Mapping[Any, int], leaf_futures: Mapping[int, list],
                   out: Callable[[Any], bool] | None = None,
                   rescue: Callable[[int, set[str]], bool] | None = None,
                   silent: Container[str] = ()) -> None:
        """Copy a stuck block to a live worker; fail the run when a block hangs wherever it runs.

        A block is stuck when every attempt of it that has not returned runs on a ``silent``
        worker (one that missed its heartbeats: frozen, most likely) or has run past half the
        block timeout: ``rescue(block, workers_tried)`` then copies it to a worker it has not run
        on (``False``: none is left), whatever the run's length, at most :data:`RESCUES` times.
        The run fails with a :class:`PipelineError` only when the block's oldest attempt is past
        the block timeout and no attempt of it has run less than half of it (it hangs wherever
        it runs, or no other worker was left). ``out(future)``: whether that attempt has not
        returned yet (default: all have not); a block that finished and waits for the rest of
        its group (:mod:`.groups`) has returned.
        """
        limit = self.limits.block_limit()
        if limit is None and not silent:
            return
        out = out or _not_returned
        for idx in sorted(set(pending.values())):
            attempts = [self.running[f.key] for f in leaf_futures.get(idx, [])
                        if f.key in self.running and out(f)]
            if not attempts:
                continue
            attempts.sort()
            t0, worker = attempts[0]
            stuck = all(w in silent or (limit is not None and now - t > limit / 2) for t, w in attempts)
            if stuck and rescue is not None and self.rescued.get(idx, 0) < RESCUES:
                if rescue(idx, {w for _, w in attempts}):
                    self.rescued[idx] = self.rescued.get(idx, 0) + 1
                    continue
            if limit is None or now - t0 <= limit or now - attempts[-1][0] <= limit / 2:
                continue
            a, b = self.bounds[idx]
            shards = f"{a}" if b - a == 1 else f"{a}-{b - 1}"
            copies = "".join(f"; a copy has run {now - t:.1f} s on worker {w}" for t, w in attempts[1:])
            raise PipelineError(shards, (
                f"did not return within {now - t0:.1f} s on worker {worker} (research.montecarlo.block-timeout "
                f"allows {limit:.1f} s; expected about {self.limits.expected_text()}){copies}: a pipeline that "
                "hangs on these shards, or a frozen worker. A thread cannot be killed: that worker's thread stays "
                "busy until the pipeline returns. Stored shards are kept; the same command resumes"))

    def speculate_copies(self, now: float, processing: dict | None, ending: bool, finished: Container[int],
                         leaf_futures: Mapping[int, list], copy: Callable[[int, str], None],
                         out: Callable[[Any], bool] | None = None) -> None:
        """Copy the stragglers among the blocks in flight: ``copy(block, slow_worker)`` for each.

        Only near the end (``ending``, and no unfinished block still waiting for a thread), with
        at least two finished blocks to take a median of, and when ``processing`` was read now.
        ``finished``: the blocks already accepted; ``out(future)``: whether that attempt has not
        returned (a block that finished and waits for its group's message has returned: it is
        neither copied nor waited for).
        """
        if self.speculate <= 0 or self.stopped or not ending or len(self.durations) < 2 or processing is None:
            return
        out = out or _not_returned
        unfinished = [i for i in leaf_futures if i not in finished and any(out(f) for f in leaf_futures[i])]
        if not unfinished:
            return
        if any(f.key not in self.running and out(f) for i in unfinished for f in leaf_futures[i]):
            return                  # a block still waits for a thread: not the end yet
        limit = self.speculate * (self.durations.median() or 0.0)
        hung = self.limits.block_limit()
        for idx in unfinished:
            self.end_seen.setdefault(idx, now)
            futs = leaf_futures[idx]
            if len(futs) > 1:
                twin = self.running.get(futs[-1].key)
                if twin is not None and now - twin[0] > limit:
                    self.stopped = True
                    a, b = self.bounds[idx]
                    self.emit("speculate-stopped", start=a, stop=b, seconds=now - twin[0])
                    return
                continue
            if now - self.end_seen[idx] < limit:
                continue
            seen = self.running.get(futs[0].key)
            if seen is None or (hung is not None and now - seen[0] > hung / 2):
                continue
            copy(idx, seen[1])
