"""Blocks in groups: one result message, one wake and one gather per group, not per block.

Dask's client machinery costs the driver about 0.7-0.8 ms of CPU per future it waits on and
gathers (the wake, the gather round trip, the report that the key is in memory; see
``benchmarks/bench_montecarlo_scale.py``), whatever the future holds. On a cluster of
thousands of cores that, not the work, is the ceiling of one client. So the blocks a driver
turn submits go in groups of up to ``research.montecarlo.group-blocks``: every block is its
own task with its own future, as before, and one more task per group, :func:`collect_group`,
takes the group's block results on a worker and hands them to the client in one message. The
driver waits on and gathers only the group's future; the blocks' futures stay the truth about
each block (its status, its error, where it runs), which is what the rest of the engine reads.

A group is *opened* (its blocks waited on and gathered one by one, as before groups existed,
and its collector cancelled) whenever the fast path would hide something the engine must see:

- the collector ended without a result (a block failed, was cancelled, or the collector
  itself failed): each block's own future then says what happened to it;
- a block of the group finished and the collector has not answered long after (a second plus
  the time ``size + 2`` blocks take): a block that hangs, or a worker frozen while holding a
  block's result (the collector's worker holds copies of the group's results too), would
  otherwise hold the group's place in the window; the driver's own bounded gathers and its
  hung-block and straggler rules take over. The same holds for a collector that finished on
  a worker frozen before its result was fetched: Dask keeps it "finished" there until the
  worker is declared dead (minutes), so a collector whose fetch timed out counts as not
  answered;
- a slow block's speculative copy won (:mod:`.stragglers`): the slow original is cancelled,
  which cancels its group's collector, and the group's other blocks answer one by one. A block
  that finished and waits for its group's message counts as returned: it is neither copied
  nor timed as hung.

Groups are only formed where they save something: never for copies, retries, restricted
recomputations (quarantine), when the client writes the store (every shard state comes back
then, and a collector would move it twice), or in a run of fewer than four windows of blocks
(milliseconds saved; and the collectors' transfers open worker-to-worker connections, which
made a ``LocalCluster`` closed right after such a run log a closed comm in Dask's shutdown). The bits cannot change: a block's state is computed
and folded exactly as before; only the message that carries it differs.

>>> collect_group(["a", "b"])
['a', 'b']
>>> chunks([0, 1, 2, 3, 4], 2)
[[0, 1], [2, 3], [4]]
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

__all__ = ["Groups", "chunks", "collect_group"]


def collect_group(results: Sequence[Any]) -> list:
    """The group's task: its blocks' results, in order, as one value (it computes nothing)."""
    return list(results)


def chunks(items: Sequence[Any], size: int) -> list[list]:
    """``items`` in consecutive runs of at most ``size``."""
    size = max(1, int(size))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


class Groups:
    """The groups in flight: each collector future and its blocks' futures, in order.

    >>> class Future:
    ...     def __init__(self, status, key="k"):
    ...         self.status, self.key = status, key
    ...     def done(self):
    ...         return self.status != "pending"
    ...     def cancel(self):
    ...         self.status = "cancelled"
    >>> groups = Groups(2)
    >>> collector, blocks = Future("pending"), [Future("finished"), Future("pending")]
    >>> groups.add(collector, blocks)
    >>> groups.overdue(now=10.0, bound=5.0)            # a block finished: its group is timed from now
    []
    >>> groups.overdue(now=16.0, bound=5.0) == [collector]
    True
    >>> groups.open(collector) == blocks, collector.status, groups.opened
    (True, 'cancelled', 1)

    A collector that finished where its result cannot be fetched (a worker frozen since) is late too:

    >>> held = Future("finished", key="mc-group-t-0-4")
    >>> groups.add(held, [Future("finished"), Future("finished")])
    >>> groups.overdue(now=20.0, bound=5.0, unfetched={"mc-group-t-0-4"})
    []
    >>> groups.overdue(now=26.0, bound=5.0, unfetched={"mc-group-t-0-4"}) == [held]
    True
    >>> groups.overdue(now=26.0, bound=5.0)                 # fetched meanwhile: the next turn takes it
    []
    """

    def __init__(self, size: int):
        self.size = max(1, int(size))
        self.live: dict[Any, list] = {}          # collector future -> block futures, in order
        self.shards: dict[Any, tuple[int, int]] = {}   # collector future -> its blocks' shards [start, stop)
        self._finished_since: dict[Any, float] = {}
        self.formed = self.opened = 0

    def __contains__(self, fut: Any) -> bool:
        return fut in self.live

    def __len__(self) -> int:
        return len(self.live)

    def add(self, collector: Any, members: list, shards: tuple[int, int] = (0, 0)) -> None:
        self.live[collector] = list(members)
        self.shards[collector] = shards
        self.formed += 1

    def take(self, collector: Any) -> list:
        """Forget ``collector`` (it answered); its block futures."""
        self._finished_since.pop(collector, None)
        self.shards.pop(collector, None)
        return self.live.pop(collector, [])

    def open(self, collector: Any) -> list:
        """Stop using ``collector`` (cancelled: nothing waits on it); its block futures."""
        members = self.take(collector)
        self.opened += 1
        collector.cancel()
        return members

    def overdue(self, now: float, bound: float, unfetched: Container[str] = ()) -> list:
        """Collectors that have not answered ``bound`` seconds after one of their blocks finished.

        A finished block waiting for its group holds its place in the window; a group stuck
        behind a block that hangs, or behind a worker frozen while it holds a block's result,
        would hold the whole window. So would a collector that finished on a worker frozen
        since: its result cannot be fetched (its key is in ``unfetched``), and Dask keeps it
        "finished" on that worker until the worker is declared dead, minutes later. Called at
        most about once a second (each call looks at the groups in flight); the caller opens
        what this returns.
        """
        late = []
        for collector, members in self.live.items():
            if collector.done() and collector.key not in unfetched:
                continue                       # answered or failed: the next turn takes it
            since = self._finished_since.get(collector)
            if since is None:
                if any(m.status == "finished" for m in members):
                    self._finished_since[collector] = now
            elif now - since > bound:
                late.append(collector)
        return late
