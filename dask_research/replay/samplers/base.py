"""The sampler role: which ring slots a batch reads, with what importance weights.

The plane owns the ring (``cursor``, ``size``, ``capacity``) and the random generator; a
sampler only turns them into slots. The valid slots of a ring are
``(cursor - size + j) % capacity`` for ``j in range(size)``, oldest first (``j`` is the age
rank). Samplers are told about new slots (:meth:`on_insert`) so that prioritized samplers can
give them the maximum priority, and they provide the *heat* that placement uses to decide which
transitions deserve the fastest tier.

What the plane, checkpoints and cluster shards read of a sampler goes through its methods:
:meth:`Sampler.leaves` (priority leaves of slots), :meth:`Sampler.mass` (the sampling mass),
:meth:`Sampler.priorities` (leaves turned back into priorities), :meth:`Sampler.state_dict` /
:meth:`Sampler.from_state` (parameters into and out of a checkpoint), checked against
:meth:`Sampler.state_schema` before a restore uses them.

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
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...durable import schema


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

    def on_insert(self, start: int, n: int) -> None:  # noqa: B027 - an optional hook
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

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:  # noqa: B027 - an optional hook
        """New priorities for ``slots``; a no-op for samplers without priorities."""

    def leaves(self, slots: np.ndarray) -> np.ndarray | None:
        """Priority leaves (``(priority + eps) ** alpha``) of ``slots``, a copy; None for
        samplers without priorities."""
        return None

    def min_leaf(self) -> float:
        """The smallest stored priority leaf (NaN without priorities)."""
        return float("nan")

    def mass(self, size: int) -> float:
        """Sampling mass of a ring holding ``size`` transitions: the number of transitions
        eligible (priority samplers: the sum of their leaves)."""
        return float(size)

    def priorities(self, slots: np.ndarray) -> np.ndarray | None:
        """Priorities of ``slots`` as :meth:`update` takes them (the leaf transform undone),
        None where they cannot be recovered (no priorities, or ``alpha == 0``)."""
        return None

    def clear(self, slots: np.ndarray) -> None:  # noqa: B027 - an optional hook
        """Remove ``slots`` from the distribution (no transition there any more)."""

    def reset(self) -> None:  # noqa: B027 - an optional hook
        """Forget every slot (a restore refills the ring)."""

    def load_leaves(self, slots: np.ndarray, leaves: np.ndarray) -> None:  # noqa: B027 - an optional hook
        """Set the priority leaves of ``slots`` as saved by :meth:`leaves` (a no-op without
        priorities)."""

    def resume(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - an optional hook
        """Take over the running state (not the parameters) recorded by :meth:`state_dict`
        of a sampler of the same class (a no-op without such state)."""

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

    @classmethod
    def state_schema(cls) -> schema.Checker:
        """What the JSON part of :meth:`state_dict` may hold (a :mod:`dask_research.durable.schema`
        checker): a restore checks a checkpoint's sampler state against it before anything uses it.
        The default admits any object (a sampler of one's own); the built-in samplers admit
        exactly what they write.

        >>> from dask_research.durable import schema
        >>> from dask_research.replay import RecentSampler
        >>> schema.check({"window": 0}, RecentSampler.state_schema(), "state")
        Traceback (most recent call last):
        ...
        dask_research.durable.schema.Invalid: state.window is 0; expected a whole number in [1, 4611686018427387904]
        """
        return schema.Obj({}, extra=schema.Any_())

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Sampler:
        """A new sampler with the parameters of :meth:`state_dict` (its JSON part: what a
        checkpoint's metadata holds), not attached to a ring.

        >>> from dask_research.replay import RecentSampler
        >>> RecentSampler.from_state(RecentSampler(window=7).state_dict())
        RecentSampler(window=7)
        """
        return cls()

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - an optional hook
        """Restore :meth:`state_dict`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
