"""Placement across workers: which shard gives transitions to which (a pure function).

Actors ingest into the shard of the worker they run on, so shards fill at the rate of their
actors. When one shard is full (its oldest transitions are being overwritten) while another is
nearly empty, experience is lost that the cluster had room for. :func:`plan_moves` decides
moves: from every shard at or above ``high`` fill to the emptiest shards at or below ``low``
fill, the *oldest* transitions of the full shard (the next ones it would overwrite) move,
at most ``max_move`` per pair and never more than half of the receiver's free room, so two
rounds cannot ping-pong. The plane executes the moves worker to worker (the data never passes
through the learner).

Examples
--------
>>> from dask_research.replay.cluster.shard_moves import plan_moves
>>> plan_moves({"a": (1000, 1000), "b": (0, 1000)}, high=0.95, low=0.5, max_move=300)
[('a', 'b', 300)]
>>> plan_moves({"a": (900, 1000), "b": (0, 1000)}, high=0.95, low=0.5, max_move=300)
[]
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

from ...exceptions import InputError

K = TypeVar("K", bound=Hashable)


def plan_moves(occupancy: Mapping[K, tuple[int, int]], high: float = 0.95,
               low: float = 0.5, max_move: int = 65_536) -> list[tuple[K, K, int]]:
    """Moves ``(source, destination, n)`` from ``occupancy`` = {shard: (size, capacity)}.

    Sources are shards with ``size >= high * capacity`` (fullest first), destinations shards
    with ``size <= low * capacity`` (emptiest first); each destination takes at most half of
    its free room per round.
    """
    if not 0 < low < high <= 1:
        raise InputError("low/high", (low, high), "0 < low < high <= 1", where="plan_moves")
    fill = {k: s / c for k, (s, c) in occupancy.items() if c > 0}
    sources = sorted((k for k, f in fill.items() if f >= high), key=lambda k: -fill[k])
    free = {k: (occupancy[k][1] - occupancy[k][0]) // 2 for k, f in fill.items() if f <= low}
    dests = sorted(free, key=lambda k: fill[k])
    moves = []
    for src in sources:
        budget = min(int(max_move), occupancy[src][0] // 2)
        for dst in dests:
            n = min(budget, free[dst])
            if n <= 0:
                continue
            moves.append((src, dst, int(n)))
            free[dst] -= n
            budget -= n
            if budget <= 0:
                break
    return moves
