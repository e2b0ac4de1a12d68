"""The sampler role: which ring slots a batch reads, with what importance weights.

The plane owns the ring (``cursor``, ``size``, ``capacity``) and the random generator; a
sampler only turns them into slots. The valid slots of a ring are
``(cursor - size + j) % capacity`` for ``j in range(size)``, oldest first (``j`` is the age
rank). Samplers are told about new slots (:meth:`on_insert`) so that prioritized samplers can
give them the maximum priority, and they provide the *heat* that placement uses to decide which
transitions deserve the fastest tier.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import UniformSampler
>>> s = UniformSampler(); s.attach(8)
>>> slots, weights = s.sample(cursor=3, size=3, batch_size=4, rng=np.random.default_rng(0))
>>> bool(((slots >= 0) & (slots < 3)).all()), weights
(True, None)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


def ring_slots(cursor: int, size: int, capacity: int, j: np.ndarray) -> np.ndarray:
    """Slots of age ranks ``j`` (0 = oldest) in a ring; modifies ``j`` in place."""
    start = (cursor - size) % capacity
    if start:
        j += start
        j %= capacity
    return j


class Sampler(ABC):
    """Base class of samplers.

    ``policy`` names the placement heat: ``"recency"`` (newest transitions are hottest) or
    ``"priority"`` (highest priority is hottest).
    """

    policy = "recency"
    prioritized = False

    def attach(self, capacity: int) -> None:
        """Size internal state for a ring of ``capacity`` slots. Called once by the plane."""
        self.capacity = int(capacity)

    def on_insert(self, start: int, n: int) -> None:
        """Slots ``start`` to ``start + n - 1`` (no wrap) now hold new transitions."""

    @abstractmethod
    def sample(self, cursor: int, size: int, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """Return ``(slots, weights)``: int64 slots and float32 importance weights or None."""

    def draw(self, total: int, size: int, batch_size: int,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Return ``(slots, keys, weights)`` of one batch from a ring that received ``total``
        transitions and holds the newest ``size`` of them.

        ``keys`` are insertion numbers (``total - size <= key < total``), ``slots`` are
        ``key % capacity``. The default calls :meth:`sample` and derives the keys from the
        slots; :class:`UniformSampler` overrides it: its integer is the age rank, so the key
        is one addition and the slot one remainder away.
        """
        cap = self.capacity
        cursor = total % cap
        slots, weights = self.sample(cursor, size, batch_size, rng)
        d = cursor - 1 - slots
        d %= cap
        return slots, (total - 1) - d, weights

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities for ``slots``; a no-op for samplers without priorities."""

    def heat(self, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Placement score of ``slots`` (higher = likelier to be sampled): recency by default."""
        return keys.astype(np.float64)

    def probabilities(self, cursor: int, size: int) -> np.ndarray:
        """Probability of sampling each slot (length ``capacity``), for tests and explanations."""
        p = np.zeros(self.capacity)
        p[ring_slots(cursor, size, self.capacity, np.arange(size))] = 1.0 / size
        return p

    def state_dict(self) -> dict[str, Any]:
        """Parameters and state; numpy arrays are allowed (checkpoints store them in .npz)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
