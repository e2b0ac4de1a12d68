"""What a run submits next: the window of blocks in flight, and handing them to Dask at once.

Blocks of shards are submitted at most ``window`` at a time (the client and scheduler never
hold a future per shard). :class:`Window` decides what goes next: it refills once a group's
worth of the window is free (any free slot when no group is in flight, or when the rest fits),
gives each block task its arguments and a key (:mod:`.keys`: copies and recomputations get
distinct keys, or Dask would hand back a cached value), hands the blocks of a driver turn to
Dask as one graph (:func:`submit_many`) and, where that saves something, in groups whose
results reach the client in one message (:mod:`.groups`). It holds what is in flight: each
pending block future and the block it computes, and every attempt of each block (the first,
copies, retries).

Examples
--------
>>> from collections import deque
>>> from dask_research.montecarlo import Job, Normal
>>> job = Job(lambda a: a, {"a": Normal(0.0, 1.0)}, shards=8, samples_per_shard=64, seed=1, range=(-8, 8))
>>> class Future:
...     def __init__(self, key):
...         self.key = key
>>> class Recorder:                          # stands in for a distributed.Client: records each graph
...     graphs = []
...     def map(self, fn, *columns, key, **kw):
...         self.graphs.append(key)
...         return [Future(k) for k in key]
>>> client = Recorder()
>>> window = Window(client, job, job.make_reducer(job.range), [(0, 2), (2, 4), (4, 6), (6, 8)], tag="ab-cd",
...                 size=3, group_blocks=1, track=lambda futures: None)
>>> todo = deque(range(4))
>>> window.refill(todo)                      # three blocks fit: one graph
>>> client.graphs, len(window.pending), list(todo)
([['mc-block-ab-cd-0-2', 'mc-block-ab-cd-2-4', 'mc-block-ab-cd-4-6']], 3, [3])
>>> first = next(iter(window.pending))
>>> window.settle(0, first) == [first], window.attempts.get(0)   # block 0 accepted: nothing else to cancel
(True, None)
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .blocks import compute_and_store_block
from .groups import Groups, chunks, collect_group
from .keys import block_key, group_key
from .shard_compute import compute_block

__all__ = ["submit_many", "Window"]


def submit_many(client: Any, func: Callable, argsets: Sequence[tuple], keys: Sequence[str],
                workers: list[str] | None = None, **kwargs: Any) -> list:
    """Submit ``func(*args, **kwargs)`` for every ``args`` of ``argsets`` in one graph; the futures.

    Several tasks are one :meth:`distributed.Client.map` call: one graph message to the
    scheduler however many blocks, and objects shared by every task (the job, the reducer)
    serialized once (about a quarter of the client's CPU per task of one submit each, at four
    tasks). One task is one :meth:`~distributed.Client.submit`, which costs the client less
    than a map of one. ``workers`` restricts the tasks to those workers (no others allowed).
    Every key the engine gives Dask is written by :mod:`dask_research.montecarlo.keys` (the
    dashboard's Shards page parses them back with the same module).
    """
    if not argsets:
        return []
    kw: dict[str, Any] = {"workers": list(workers), "allow_other_workers": False} if workers else {}
    if len(argsets) == 1:
        return [client.submit(func, *argsets[0], key=keys[0], pure=False, **kw, **kwargs)]
    return client.map(func, *(list(column) for column in zip(*argsets)), key=list(keys), pure=False, **kw,
                      **kwargs)


class Window:
    """The blocks in flight of one execution, and what to submit next.

    ``bounds`` are the blocks' shard ranges, ``tag`` the run's key tag, ``size`` the blocks in
    flight at once, ``group_blocks`` the most blocks per group, ``track(futures)`` what is told
    of every future the driver will wait on (:meth:`.Arrivals.track`). ``known`` holds the
    states reused from the store (the execution's own dict: a quarantine drops from it),
    ``keep`` the shards whose states the client keeps for verification; ``target`` is where
    block tasks write the store (``None``: they do not), ``with_store`` whether the run has one
    (then without a ``target`` every shard state comes back for the client to write).

    A future is in the window (``fut in window``) while the driver waits on it: a block's
    own, or a group's collector.
    """

    def __init__(self, client: Any, job: Any, reducer: Any, bounds: Sequence[tuple[int, int]], *, tag: str,
                 size: int, group_blocks: int, track: Callable[[list], None],
                 known: Mapping[int, Any] | None = None, keep: set[int] | frozenset[int] = frozenset(),
                 target: Any = None, with_store: bool = False):
        self.client, self.job, self.reducer, self.bounds, self.tag = client, job, reducer, bounds, tag
        self.size, self.track = max(1, int(size)), track
        self.known: Mapping[int, Any] = known if known is not None else {}
        self.keep, self.target, self.with_store = keep, target, with_store
        # At most half the window per group, so that half the window stays in flight while a
        # group's results travel and the next group is submitted: the workers never run dry.
        self.groups = Groups(min(group_blocks, max(1, self.size // 2)))
        # A run of fewer than 4 windows of blocks forms no groups: it saves milliseconds there, and
        # the transfers to a collector's worker leave worker-to-worker connections that make a
        # LocalCluster closed right after the run race its own shutdown (Dask logs a closed comm).
        self.may_group = self.groups.size > 1 and len(bounds) >= 4 * self.size
        self.pending: dict[Any, int] = {}            # block future -> block index
        self.attempts: dict[int, list] = {}          # block index -> its futures (first, copies, retries)
        self.copies: set[str] = set()                # keys of speculative copies
        self.redo = False                            # recomputing after a quarantine: no tree, "redo" keys
        self.riders: dict[int, tuple[int, ...]] = {}  # block index -> shards of other blocks it rechecks
        self.max_in_flight = 0

    def __contains__(self, fut: Any) -> bool:
        return fut in self.pending or fut in self.groups

    def refill(self, todo: deque) -> None:
        """Submit the next blocks of ``todo`` if enough of the window is free.

        Once a group's worth of the window is free; any free slot when no group is in flight
        (nothing would free a group's worth at once: blocks stuck one by one on a frozen worker
        must not starve the run) or when the rest fits.
        """
        free = self.size - len(self.pending)
        if todo and free > 0 and (free >= self.groups.size or not self.groups or len(todo) <= free):
            self.submit([todo.popleft() for _ in range(min(free, len(todo)))])

    def submit(self, idxs: list[int], workers: list[str] | None = None, speculative: bool = False,
               retry: int = 0) -> None:
        """Submit blocks ``idxs`` as one graph (restricted to ``workers`` if given)."""
        writes_or_none = self.target is not None or not self.with_store
        argsets: list[tuple] = []
        keys: list[str] = []
        for idx in idxs:
            a, b = self.bounds[idx]
            known = {s: self.known[s] for s in range(a, b) if s in self.known} if self.known else {}
            keys.append(block_key(self.tag, a, b, speculative=speculative, tree=not self.redo, retry=retry))
            recheck = () if self.redo else self.riders.get(idx, ())    # every attempt carries them
            if writes_or_none:
                # The block's task writes the store, or there is none: only the states the client
                # keeps for verification come back with the block's root (see .blocks).
                keep = tuple(sorted(s for s in self.keep if a <= s < b))
                argsets.append((self.job, self.reducer, a, b, known, self.target, keep, recheck))
            else:
                argsets.append((self.job, self.reducer, a, b, known, recheck))
        if writes_or_none:
            futs = submit_many(self.client, compute_and_store_block, argsets, keys, workers, trim=not self.with_store)
        else:
            futs = submit_many(self.client, compute_block, argsets, keys, workers)
        for idx, fut in zip(idxs, futs):
            self.pending[fut] = idx
            self.attempts.setdefault(idx, []).append(fut)
            if speculative:
                self.copies.add(fut.key)
        # Groups only where they save something (see .groups): not in a small run, nor for copies,
        # retries or recomputations on chosen workers, nor when every shard state comes back.
        grouped = (self.may_group and writes_or_none and len(futs) > 1 and not speculative
                   and not retry and workers is None)
        parts = chunks(futs, self.groups.size) if grouped else [[f] for f in futs]
        self.track([part[0] for part in parts if len(part) == 1] + self._submit_groups(
            [part for part in parts if len(part) > 1]))
        self.max_in_flight = max(self.max_in_flight, len(self.pending))

    def _submit_groups(self, parts: list[list]) -> list:
        """One collector task per part (one graph for all of them); the collectors' futures."""
        if not parts:
            return []
        spans = [(self.bounds[self.pending[p[0]]][0], self.bounds[self.pending[p[-1]]][1]) for p in parts]
        keys = [group_key(self.tag, a, b) for a, b in spans]
        # Ahead of any block not started yet: a group's results leave as soon as its last block ends.
        collectors = submit_many(self.client, collect_group, [(p,) for p in parts], keys, priority=1)
        for collector, part, span in zip(collectors, parts, spans):
            self.groups.add(collector, part, span)
        return collectors

    def open_group(self, collector: Any) -> tuple[int, int]:
        """Wait on ``collector``'s blocks one by one from now on (see :mod:`.groups`); the
        group's shard range ``(start, stop)``."""
        shards = self.groups.shards.get(collector, (0, 0))
        self.track([m for m in self.groups.open(collector) if m in self.pending])
        return shards

    def settle(self, idx: int, winner: Any) -> list:
        """Block ``idx`` was accepted from ``winner``: forget its attempts, cancel the others; all of them."""
        attempts = self.attempts.pop(idx, [])
        for other in attempts:
            if other is not winner:
                self.pending.pop(other, None)
                other.cancel()
        return attempts

    def in_flight(self, idx: int) -> list:
        """The attempts of block ``idx`` still pending."""
        return [f for f in self.attempts.get(idx, []) if f in self.pending]

    def drop(self, idx: int, fut: Any) -> None:
        """Forget attempt ``fut`` of block ``idx`` (it failed and is tried elsewhere)."""
        self.attempts[idx] = [f for f in self.attempts.get(idx, []) if f is not fut]

    def take_all(self) -> list:
        """Every future in flight (blocks and collectors), forgotten: the caller cancels them."""
        futs = list(self.pending) + list(self.groups.live)
        self.pending.clear()
        self.groups.live.clear()
        self.groups.shards.clear()
        return futs
