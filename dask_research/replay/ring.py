"""The ring of an experience plane: keys, cursor, validity and eviction, in one place.

``total`` transitions were ever inserted; the newest ``size`` are stored. Transition *key*
``k`` (its insertion number) lives in slot ``k % capacity`` and is valid while
``total - size <= k < total``. A :class:`Ring` holds only these counters; the plane holds its
lock while it reads or moves them, and the storages and samplers hold what the slots contain.

Examples
--------
>>> import numpy as np
>>> r = Ring(4)
>>> r.segments(3), r.advance(3), (r.total, r.size, r.cursor)
([(0, 0, 3)], None, (3, 3, 3))
>>> r.segments(3)                   # wraps: slot 3, then slots 0 and 1
[(3, 0, 1), (0, 1, 2)]
>>> r.advance(3)
>>> r.stored()                      # (slots, keys), oldest first
(array([2, 3, 0, 1]), array([2, 3, 4, 5]))
>>> r.valid(np.array([1, 2, 5, 6])).tolist()
[False, True, True, False]
>>> r.keys(np.array([0, 3])).tolist()
[4, 3]
>>> r.evict_oldest(2)               # the two oldest leave the ring
(array([2, 3]), array([2, 3]))
>>> (r.total, r.size, r.first)
(6, 2, 4)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import config
from ..exceptions import CapacityError, InputError

__all__ = ["Ring", "fit_batch", "MAX_KEYS"]

#: The most keys a ring hands out (``2**62``): a restore refuses counters beyond it, which
#: leaves ``2**62`` more insertions before an int64 key could overflow (centuries at any rate).
MAX_KEYS = 2**62


def fit_batch(fields: Mapping[str, Any], n: int, capacity: int, itemsize: int,
              overflow: str | None = None) -> tuple[dict[str, Any], int]:
    """A batch of ``n > capacity`` transitions made to fit the ring: ``(fields, skip)``.

    ``overflow`` (default ``research.replay.overflow``): ``"keep-newest"`` keeps the newest
    ``capacity`` and skips the ``skip`` oldest (they count as inserted and overwritten, as
    SB3's and TorchRL's rings do); ``"raise"`` raises :class:`CapacityError`.

    >>> import numpy as np
    >>> fields, skip = fit_batch({"x": np.arange(5)}, 5, 3, 8, "keep-newest")
    >>> fields["x"].tolist(), skip
    ([2, 3, 4], 2)
    """
    overflow = config.resolve("replay.overflow", overflow)
    if overflow == "keep-newest":
        skip = n - capacity
        return {k: v[skip:] for k, v in fields.items()}, skip
    if overflow == "raise":
        raise CapacityError(f"a batch of {n:,} transitions (the plane holds {capacity:,}; ingest in "
                            "smaller batches, give the plane more capacity, or pass "
                            "overflow='keep-newest')", n * itemsize, capacity * itemsize)
    raise InputError("overflow", overflow, "'raise' or 'keep-newest'", where="ingest")


class Ring:
    """Insertion counters of a FIFO ring of ``capacity`` slots (see the module docstring).

    Attributes ``total`` and ``size`` are plain integers; the owner mutates them only through
    :meth:`skip`, :meth:`advance`, :meth:`reset` and :meth:`evict_oldest`.
    """

    __slots__ = ("capacity", "total", "size")

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.total = 0
        self.size = 0

    # --- reads ------------------------------------------------------------------------------
    @property
    def cursor(self) -> int:
        """Slot the next transition goes to."""
        return self.total % self.capacity

    @property
    def first(self) -> int:
        """Key of the oldest stored transition (``total`` when the ring is empty)."""
        return self.total - self.size

    def valid(self, keys: np.ndarray) -> np.ndarray:
        """Mask of the ``keys`` that are stored now (not overwritten, already inserted)."""
        return (keys >= self.total - self.size) & (keys < self.total)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """Slots of ``keys`` (meaningful for valid keys)."""
        return keys % self.capacity

    def keys(self, slots: np.ndarray) -> np.ndarray:
        """Keys (insertion numbers) of valid ``slots``."""
        d = self.cursor - 1 - slots
        d %= self.capacity
        return (self.total - 1) - d

    def stored(self) -> tuple[np.ndarray, np.ndarray]:
        """All valid ``(slots, keys)``, oldest first."""
        keys = np.arange(self.total - self.size, self.total, dtype=np.int64)
        return keys % self.capacity, keys

    def newest(self, n: int) -> np.ndarray:
        """Keys of the ``n`` newest insertions (stored or not: ``total - n .. total - 1``)."""
        return np.arange(self.total - n, self.total, dtype=np.int64)

    def segments(self, n: int) -> list[tuple[int, int, int]]:
        """Where the next ``n <= capacity`` transitions go: ``(slot, offset, count)`` runs,
        one, or two when the ring wraps (``offset`` indexes the batch)."""
        c = self.total % self.capacity
        first = min(n, self.capacity - c)
        if first == n:
            return [(c, 0, n)]
        return [(c, 0, first), (0, first, n - first)]

    # --- moves ------------------------------------------------------------------------------
    def skip(self, n: int) -> None:
        """Count ``n`` keys as inserted and overwritten at once (a batch larger than the ring
        keeps its newest transitions; the older ones take no slot)."""
        self.total += n

    def advance(self, n: int) -> None:
        """``n`` transitions were written at :meth:`segments` ``(n)``."""
        self.total += n
        size = self.size + n
        self.size = size if size < self.capacity else self.capacity      # (add()'s hot path)

    def reset(self, total: int) -> None:
        """Empty the ring with ``total`` keys already used (restores start here)."""
        self.total, self.size = int(total), 0

    def evict_oldest(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the ``min(n, size)`` oldest transitions; returns their ``(slots, keys)``
        (their records stay in the storage until overwritten)."""
        n = min(int(n), self.size)
        keys = np.arange(self.total - self.size, self.total - self.size + n, dtype=np.int64)
        self.size -= n
        return keys % self.capacity, keys

    def __repr__(self) -> str:
        return f"Ring(capacity={self.capacity}, total={self.total}, size={self.size})"
