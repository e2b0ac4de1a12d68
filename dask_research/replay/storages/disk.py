"""Disk: the same record layout in a numpy memmap (:class:`DiskStorage`).

A uniquely named file ``<path>/<name>-XXXX.records`` holds ``rows`` aligned records; reads and writes go
through the page cache, so a disk tier is as fast as host memory while the OS has room and
falls back to the device's speed when it does not. The file is removed on :meth:`close`
unless ``keep=True``.

Examples
--------
>>> import numpy as np, tempfile
>>> from dask_research.replay import ExperienceSpec, DiskStorage
>>> s = DiskStorage(ExperienceSpec({"r": ((), "float32")}), rows=4, path=tempfile.mkdtemp())
>>> s.write_fields(0, {"r": np.array([5.0])})
>>> out = s.spec.empty(1); s.read_records(np.array([0]), out); float(out["r"][0])
5.0
>>> s.close()
"""
from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np

from ..spec import ExperienceSpec
from .base import Storage
from .host import HostStorage


class DiskStorage(HostStorage):
    """Records in a numpy memmap under ``path``.

    Parameters
    ----------
    spec : ExperienceSpec
    rows : int
    path : str or path-like
        Directory; created if missing.
    name : str, optional
        File stem (default ``"disk"``).
    keep : bool
        Keep the file on :meth:`close` (default: remove it).
    """

    kind = "disk"
    #: random reads over the whole file, as the tier will serve them (not the host probe)
    measure_bandwidth = Storage.measure_bandwidth

    def __init__(self, spec: ExperienceSpec, rows: int, path: str | os.PathLike,
                 name: str | None = None, keep: bool = False):
        self.path = pathlib.Path(path)
        self.keep = keep
        super(HostStorage, self).__init__(spec, rows, name)
        self.path.mkdir(parents=True, exist_ok=True)
        fd, fname = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".records", dir=self.path)
        os.close(fd)                        # a unique file: planes may share a directory
        self.file = pathlib.Path(fname)
        mm = np.memmap(self.file, dtype=self.spec.record_dtype, mode="w+", shape=(max(self.rows, 1),))
        self._bind(mm[: self.rows])

    def close(self) -> None:
        data = self.data
        self._bind(np.zeros(0, dtype=self.spec.record_dtype))
        del data
        if not self.keep:
            try:
                self.file.unlink()
            except OSError:
                pass
