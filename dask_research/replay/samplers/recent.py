"""Uniform sampling over the most recent ``window`` transitions.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import RecentSampler
>>> s = RecentSampler(window=2); s.attach(8)
>>> sorted(set(s.sample(cursor=5, size=5, batch_size=64, rng=np.random.default_rng(0))[0].tolist()))
[3, 4]
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...durable import schema
from ...exceptions import InputError
from ..ring import MAX_KEYS
from .base import Sampler, ring_slots


class RecentSampler(Sampler):
    """Uniform over the newest ``window`` transitions (all of them while fewer are stored).

    Parameters
    ----------
    window : int
        How many of the newest transitions are eligible.
    """

    def __init__(self, window: int = 10_000):
        if int(window) < 1:
            raise InputError("window", window, "a positive number of transitions", where="RecentSampler")
        self.window = int(window)

    def sample(self, cursor: int, size: int, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, None]:
        lo = max(0, size - self.window)
        j = rng.integers(lo, size, batch_size)
        return ring_slots(cursor, size, self.capacity, j), None

    def probabilities(self, cursor: int, size: int) -> np.ndarray:
        p = np.zeros(self.capacity)
        lo = max(0, size - self.window)
        p[ring_slots(cursor, size, self.capacity, np.arange(lo, size))] = 1.0 / (size - lo)
        return p

    def mass(self, size: int) -> float:
        return float(min(size, self.window))

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window}

    @classmethod
    def state_schema(cls) -> schema.Checker:
        return schema.Obj({"window": schema.Int(1, MAX_KEYS)})

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RecentSampler:
        return cls(window=state["window"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = int(state.get("window", self.window))

    def __repr__(self) -> str:
        return f"RecentSampler(window={self.window})"
