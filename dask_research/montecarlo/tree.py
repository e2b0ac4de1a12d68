"""The fixed reduction tree over shard indices.

Level 0 holds the shards in index order; each level merges neighbours ``(2m, 2m + 1)`` and
passes an unpaired last node up unchanged. A node at level ``j`` covers shards
``[m * 2**j, min((m + 1) * 2**j, shards))``, so any aligned block of ``2**j`` shards is a
subtree: tasks may compute blocks of any power-of-two size and the root is the same bits.

Examples
--------
>>> from dask_research.montecarlo.tree import tree_fold, block_bounds
>>> tree_fold(lambda a, b: f"({a}{b})", list("abcde"))
'(((ab)(cd))e)'
>>> block_bounds(10, 4)
[(0, 4), (4, 8), (8, 10)]
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["tree_fold", "block_bounds", "choose_block"]

T = TypeVar("T")


def tree_fold(merge: Callable[[T, T], T], items: Sequence[T]) -> T:
    """Fold ``items`` with the fixed pairwise tree, holding one level at a time.

    ``merge`` may build futures instead of values.
    """
    if not items:
        raise ValueError("the reduction tree needs at least one leaf")
    level = list(items)
    while len(level) > 1:
        nxt = [merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def block_bounds(shards: int, block: int) -> list[tuple[int, int]]:
    """Aligned ``[start, stop)`` blocks of ``block`` shards (the last may be shorter)."""
    if block < 1 or block & (block - 1):
        raise ValueError(f"block={block} must be a power of two")
    return [(s, min(s + block, shards)) for s in range(0, shards, block)]


def choose_block(shards: int, shard_seconds: float, threads: int, target_seconds: float,
                 max_block: int, min_tasks_per_thread: int = 4, client_block_seconds: float = 0.0) -> int:
    """Power-of-two shards per task: about ``target_seconds`` a task, enough tasks to balance.

    The time target is rounded to the *nearest* power of two (a task takes 0.71-1.41 x the
    target): rounding down, as before, made the block size flip between two values with the
    pilot's timing noise, and halving the blocks doubles the per-task overhead.

    ``client_block_seconds`` is the CPU one block costs the client or the scheduler, whichever
    is more (``research.montecarlo.client-block-seconds``, 1.5 ms by default; 0: off).
    ``threads`` threads finish ``threads / task time`` blocks a second, so the target grows to
    at least ``2 * threads * client_block_seconds``: on a large cluster tasks get longer rather
    than the client or the scheduler saturating (each stays at most half busy), still bounded
    by ``max_block`` and by the balance rule. Up to 100 threads the default changes nothing.

    >>> choose_block(640, 0.0106, threads=2, target_seconds=0.3, max_block=4096)
    32
    >>> choose_block(10**7, 0.0075, threads=1000, target_seconds=0.3, max_block=4096, client_block_seconds=0.002)
    512
    """
    target_seconds = max(target_seconds, 2.0 * threads * max(client_block_seconds, 0.0))
    by_time = 2.0 ** round(math.log2(max(target_seconds / max(shard_seconds, 1e-9), 1.0)))
    by_balance = shards / max(1, threads * min_tasks_per_thread)
    want = max(1.0, min(by_time, by_balance, float(max_block)))
    return 1 << int(math.floor(math.log2(want)))
