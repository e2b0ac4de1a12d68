"""Host memory: a numpy ring of aligned records (:class:`HostStorage`).

One structured array of the spec's aligned record dtype. Ingest writes each field into a
contiguous row range (a strided copy per field); sampling gathers whole records with one
``np.take`` over a fixed-width ``void`` view, which is several times faster than fancy indexing
a structured array, and the fields of the gathered batch are zero-copy views.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import ExperienceSpec, HostStorage
>>> s = HostStorage(ExperienceSpec({"r": ((), "float32")}), rows=4)
>>> s.write_fields(1, {"r": np.array([1.0, 2.0])})
>>> out = s.spec.empty(1); s.read_records(np.array([2]), out); float(out["r"][0])
2.0
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..spec import ExperienceSpec
from .base import Storage


def _check_host_memory(needed: int, what: str) -> None:
    """Refuse up front an allocation larger than the memory this machine has available."""
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # pragma: no cover - psutil comes with distributed
        return
    if needed > available:
        from ...exceptions import CapacityError

        raise CapacityError(what, needed, available)


class HostStorage(Storage):
    """Records in a numpy structured array in host memory.

    Parameters
    ----------
    spec : ExperienceSpec
    rows : int
        Capacity in transitions.
    name : str, optional
    prefault : bool
        Touch every page now, so that ingest never pays the kernel's first-touch page faults
        (about 0.3 s per GB, once, at construction instead of during the run), at the price
        of the whole capacity in resident memory from the start. Default False: memory is
        reserved, and becomes resident as rows are written (the RSS follows what is stored).
    """

    kind = "host"

    def __init__(self, spec: ExperienceSpec, rows: int, name: str | None = None,
                 prefault: bool = False):
        super().__init__(spec, rows, name)
        _check_host_memory(self.rows * self.spec.itemsize, f"a host tier of {self.rows:,} transitions")
        data = np.zeros(self.rows, dtype=self.spec.record_dtype)
        if prefault and self.rows:
            data.view(np.uint8).fill(0)
        self._bind(data)

    def _bind(self, data: np.ndarray) -> None:
        self.data = data
        self._void = data.view(np.dtype((np.void, self.spec.itemsize)))
        self._views = {n: data[n] for n in self.spec.names}
        self._record_dtype = self.spec.record_dtype

    def write_fields(self, start: int, fields: Mapping[str, np.ndarray]) -> None:
        views = self._views
        for name, a in fields.items():
            views[name][start:start + len(a)] = a

    def write_records(self, rows: np.ndarray, records: np.ndarray) -> None:
        self._void[rows] = records.view(self._void.dtype)

    def read_records(self, rows: np.ndarray, out: np.ndarray) -> None:
        np.take(self._void, rows, out=out.view(self._void.dtype))

    def measure_bandwidth(self, probe_rows: int = 16_384, repeat: int = 3,
                          span: int | None = None) -> float:
        """Random-row gather bandwidth over the first ``span`` rows (default ``probe_rows``),
        whose pages are touched first (one byte a page rewritten with itself: the contents do
        not change): reads of never-written memory would time page faults, not memory, and
        touching the whole storage would make it resident before anything is stored."""
        n = max(1, min(self.rows, span or probe_rows))
        page = self.data.view(np.uint8)[: n * self.spec.itemsize: 4096]
        page[:] = page.copy()
        return super().measure_bandwidth(probe_rows, repeat, span=n)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` gathered into a fresh record array (faster than :meth:`read_records`:
        ``np.take`` into ``out=`` buffers its output when checking the indices)."""
        # frombuffer: a writable record view of the fresh bytes, without the Python-level
        # safety check that .view() runs for structured dtypes
        return np.frombuffer(self._void.take(rows), self._record_dtype)

    def close(self) -> None:
        self._bind(np.zeros(0, dtype=self.spec.record_dtype))
