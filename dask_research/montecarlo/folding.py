"""The fixed tree over a run's blocks, folded as the blocks arrive, in any order.

Every merge whose two children exist is done at once, so the root exists the moment the last
block arrives, and it is the same tree (so the same bits) as :func:`.tree.tree_fold` over the
blocks in index order, whatever the order they arrive in.

>>> from dask_research.montecarlo.tree import tree_fold
>>> folder = TreeFolder(5, lambda a, b: f"({a}{b})")
>>> for m in (3, 0, 4, 1, 2):
...     folder.arrive(m, "abcde"[m])
>>> folder.root
'(((ab)(cd))e)'
>>> folder.root == tree_fold(lambda a, b: f"({a}{b})", list("abcde"))
True
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TreeFolder"]


class TreeFolder:
    """Merge ``blocks`` leaves with ``merge`` along the fixed tree as they arrive; ``root`` at the end.

    >>> folder = TreeFolder(2, lambda a, b: a + b)
    >>> folder.arrive(1, 10)
    >>> folder.root is None, folder.nodes
    (True, {(0, 1): 10})
    >>> folder.arrive(0, 5)
    >>> folder.root
    15
    """

    def __init__(self, blocks: int, merge: Callable[[Any, Any], Any]):
        self.merge = merge
        self.sizes = [blocks]
        while self.sizes[-1] > 1:
            self.sizes.append((self.sizes[-1] + 1) // 2)
        self.nodes: dict[tuple[int, int], Any] = {}
        self.root: Any = None

    def arrive(self, m: int, node: Any, level: int = 0) -> None:
        """Node ``m`` of ``level`` exists: merge it with its sibling if that exists, upward."""
        while True:
            n = self.sizes[level]
            if n == 1:
                self.root = node
                return
            if m == n - 1 and m % 2 == 0:       # an unpaired last node moves up as is
                level, m = level + 1, m // 2
                continue
            sib = m ^ 1
            if (level, sib) not in self.nodes:
                self.nodes[(level, m)] = node
                return
            other = self.nodes.pop((level, sib))
            left, right = (node, other) if m < sib else (other, node)
            node = self.merge(left, right)
            level, m = level + 1, m // 2
