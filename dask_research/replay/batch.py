"""A delivered batch: fields plus the keys to update priorities with, and importance weights.

Examples
--------
>>> import numpy as np
>>> b = Batch({"obs": np.zeros((2, 4))}, indices=np.array([7, 9]), weights=None)
>>> b.obs.shape, b["obs"].shape, b.size, list(b)
((2, 4), (2, 4), 2, ['obs'])
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


class Batch(Mapping):
    """Mapping of field name to array (numpy, torch or CuPy), with attributes:

    - ``indices``: int64 numpy array of transition *keys* (insertion numbers, not ring slots);
      pass them to ``plane.update_priorities``; keys of transitions overwritten since the batch
      was sampled are ignored there.
    - ``weights``: importance weights (prioritized sampling) in the batch's array type, or None.
    - ``info``: per-batch timings in seconds (``sample``, ``gather``, ``transform``, ``copy``).

    Fields are also attributes (``batch.obs``).
    """

    __slots__ = ("data", "indices", "weights", "info")

    def __init__(self, data: dict[str, Any], indices: np.ndarray, weights: Any = None,
                 info: dict[str, float] | None = None):
        self.data = data
        self.indices = indices
        self.weights = weights
        self.info = info if info is not None else {}

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in Batch.__slots__:   # copy/pickle probe unset slots
            raise AttributeError(name)
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(f"batch has no field {name!r} (fields: {', '.join(self.data)})")

    @property
    def size(self) -> int:
        """Number of transitions."""
        return len(self.indices)

    def copy(self) -> Batch:
        """A batch whose arrays are copies (numpy/torch/CuPy all provide ``.copy`` or ``.clone``)."""
        def cp(a):
            return a.clone() if hasattr(a, "clone") else a.copy()
        return Batch({k: cp(v) for k, v in self.data.items()}, self.indices.copy(),
                     None if self.weights is None else cp(self.weights), dict(self.info))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {getattr(v, 'dtype', '?')}{tuple(getattr(v, 'shape', ()))}"
                          for k, v in self.data.items())
        w = "" if self.weights is None else ", weights"
        return f"Batch(size={self.size}, {{{inner}}}{w})"
