"""The storage role: rows of transition records in one kind of memory.

A storage holds ``rows`` records of the spec's aligned record dtype and knows how to write
fields into a contiguous range of rows, write whole records into arbitrary rows, and gather
arbitrary rows into a host record buffer. It knows nothing about rings, sampling or placement;
the plane and :class:`~dask_research.replay.storages.TieredStorage` decide which rows to use.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import ExperienceSpec, HostStorage
>>> spec = ExperienceSpec({"x": ((2,), "float32")})
>>> s = HostStorage(spec, rows=8)
>>> s.write_fields(0, {"x": np.arange(6, dtype="float32").reshape(3, 2)})
>>> out = spec.empty(2)
>>> s.read_records(np.array([2, 0]), out)
>>> out["x"].tolist()
[[4.0, 5.0], [0.0, 1.0]]
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..spec import ExperienceSpec


class Storage(ABC):
    """Base class of storages. Subclasses implement the four abstract methods.

    Attributes: ``spec``, ``rows`` (capacity in transitions), ``kind`` (``"host"``,
    ``"device"`` or ``"disk"``), ``name``.
    """

    kind: str = "abstract"
    #: transitions moved between tiers (a single storage moves none)
    moves: int = 0

    def __init__(self, spec: ExperienceSpec, rows: int, name: str | None = None):
        self.spec = ExperienceSpec(spec) if not isinstance(spec, ExperienceSpec) else spec
        self.rows = int(rows)
        self.name = name or self.kind

    @property
    def nbytes(self) -> int:
        """Bytes of record data this storage holds when full (its footprint)."""
        return self.rows * self.spec.itemsize

    @abstractmethod
    def write_fields(self, start: int, fields: Mapping[str, np.ndarray]) -> None:
        """Write validated fields (leading axis ``n``) into rows ``start`` to ``start + n - 1``."""

    @abstractmethod
    def write_records(self, rows: np.ndarray, records: np.ndarray) -> None:
        """Write host structured ``records`` into the given ``rows`` (any order)."""

    @abstractmethod
    def read_records(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Gather ``rows`` into the host structured array ``out`` (``len(out) == len(rows)``)."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release memory or files. The storage is unusable afterwards."""

    def tier_stats(self, used: int) -> list[dict[str, Any]]:
        """The ``tiers`` entry of ``plane.stats()`` for a plane storing ``used`` transitions
        here: this storage as its one tier."""
        return [{"name": self.name, "kind": self.kind, "used": used, "rows": self.rows,
                 "bytes_used": used * self.spec.itemsize, "capacity_bytes": self.nbytes,
                 "bandwidth": None}]

    def measure_bandwidth(self, probe_rows: int = 16_384, repeat: int = 3,
                          span: int | None = None) -> float:
        """Random-row gather bandwidth into host memory, in bytes per second (best of ``repeat``).

        Reads only, of ``probe_rows`` rows drawn from the first ``span`` (default: all); the
        contents are whatever the rows hold (zeros for new storages).
        """
        n = max(1, min(self.rows, probe_rows))
        rows = np.random.default_rng(0).integers(0, max(1, min(self.rows, span or self.rows)), n)
        out = self.spec.empty(n)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.read_records(rows, out)
            best = min(best, time.perf_counter() - t0)
        return n * self.spec.itemsize / max(best, 1e-9)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, rows={self.rows:,}, nbytes={self.nbytes:,})"
