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

from ...durable import oserror
from ...exceptions import CapacityError, InputError
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
        if not isinstance(path, (str, os.PathLike)):
            raise InputError("path", path, "a directory path (str or path-like)", where="DiskStorage")
        self.path = pathlib.Path(path)
        self.keep = keep
        super(HostStorage, self).__init__(spec, rows, name)
        where = f"disk tier {self.name!r}"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # a unique file (planes may share a directory), mapped through the descriptor
            # mkstemp opened: reopening it by name would follow a link put in its place
            fd, fname = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".records", dir=self.path)
        except OSError as e:
            raise InputError("path", os.fspath(path), "a directory this process can create files "
                             f"in ({oserror(e)})", where=where) from None
        self.file = pathlib.Path(fname)
        nbytes = max(self.rows, 1) * self.spec.itemsize
        try:
            with os.fdopen(fd, "r+b") as f:         # closes the descriptor on every path
                st = os.fstatvfs(f.fileno())
                free = st.f_bavail * st.f_frsize
                if nbytes > free:   # its pages would outgrow the disk: SIGBUS in mid-ingest
                    raise CapacityError(f"{where} of {self.rows:,} transitions under {self.path}",
                                        nbytes, free)
                mm = np.memmap(f, dtype=self.spec.record_dtype, mode="r+", shape=(max(self.rows, 1),))
        except BaseException:
            self.file.unlink(missing_ok=True)
            raise
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
