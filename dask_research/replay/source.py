"""What a batch iterator draws from: one :class:`Draw`, the :class:`BatchSource` protocol.

:class:`~dask_research.replay.ExperiencePlane` is a batch source; the delivery pipeline
(:class:`~dask_research.replay.BatchIterator`) receives one and needs nothing else of the plane,
so delivery does not import the plane (nor the plane delivery's internals).

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane({"x": ((), "float32")}, capacity=10, seed=0)
>>> _ = plane.ingest({"x": np.arange(5)})
>>> isinstance(plane, BatchSource)
True
>>> d = plane.draw(3, leaves=True)
>>> d.records.shape, d.keys.dtype, d.weights, d.leaves
((3,), dtype('int64'), None, None)
>>> plane.close()
"""
from __future__ import annotations

import threading
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..exceptions import ResearchError
from .rate_limiter import RateLimiter
from .spec import ExperienceSpec

__all__ = ["EmptyPlaneError", "PlaneClosedError", "Draw", "BatchSource"]


class EmptyPlaneError(ResearchError, LookupError):
    """Sampling from a plane that holds no transitions."""

    def __str__(self) -> str:
        return "cannot sample from an empty experience plane; ingest transitions first"


class PlaneClosedError(ResearchError, RuntimeError):
    """Using a plane after its ``close()`` (its tiers and their files are released)."""

    def __init__(self, name: str, doing: str):
        self.name = name
        self.doing = doing
        super().__init__(name, doing)

    def __str__(self) -> str:
        return (f"{self.doing}: experience plane {self.name!r} is closed (its tiers are released); "
                "make a new plane, or restore one from a checkpoint")


class Draw(NamedTuple):
    """One sampled batch as the plane gathered it (see ``ExperiencePlane.draw``).

    ``records``: a structured record array (or, gathered on a GPU tier, an ``(n, itemsize)``
    uint8 CuPy array); ``keys``: int64 insertion numbers; ``weights``: float32 importance
    weights or None; ``leaves``: the priority leaves of the drawn slots when asked for and the
    sampler has priorities, else None.
    """

    records: Any
    keys: np.ndarray
    weights: np.ndarray | None
    leaves: np.ndarray | None = None


@runtime_checkable
class BatchSource(Protocol):
    """What delivery needs of a plane: its spec, rate limiter, lock, :meth:`draw` and (for
    transforms that look at neighbours) :meth:`gather_keys`."""

    spec: ExperienceSpec
    rate_limiter: RateLimiter | None

    @property
    def lock(self) -> threading.RLock:
        """Held while a batch is numbered and drawn (re-entrant)."""
        ...

    def draw(self, batch_size: int, out: np.ndarray | None = None,
             times: dict[str, float] | None = None, device_ok: bool = False,
             leaves: bool = False) -> Draw:
        """Sample and gather one batch."""
        ...

    def gather_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Records of ``keys`` and the mask of valid ones."""
        ...
