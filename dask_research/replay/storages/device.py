"""Device memory: records as raw bytes in a CuPy array (:class:`DeviceStorage`).

CuPy has no structured dtypes, so a device ring is a ``uint8`` array of shape
``(rows, itemsize)``; a record is its row of bytes in the spec's aligned layout, and fields are
typed strided views at their byte offsets (see :func:`field_views`). CuPy is imported when a
DeviceStorage is created, never at ``import dask_research.replay``.

The array module is a parameter (``xp``) so that the same code runs on numpy in CPU-only
tests; with ``xp=None`` it is CuPy on ``device``.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import ExperienceSpec, DeviceStorage
>>> s = DeviceStorage(ExperienceSpec({"r": ((), "float32")}), rows=4, xp=np)  # numpy stand-in
>>> s.write_fields(0, {"r": np.array([7.0, 8.0])})
>>> out = s.spec.empty(1); s.read_records(np.array([1]), out); float(out["r"][0])
8.0
"""
from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from ..spec import ExperienceSpec
from .base import Storage


def import_cupy() -> ModuleType:
    """Import CuPy or raise an ImportError that says how to get it."""
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("DeviceStorage and GPU delivery need CuPy: "
                          "pip install 'dask-research[gpu]'") from e
    return cupy


def field_views(spec: ExperienceSpec, raw: Any, xp: ModuleType) -> dict[str, Any]:
    """Typed zero-copy views of each field of a ``(n, itemsize)`` uint8 array ``raw``.

    Works for numpy and CuPy arrays (both accept ``ndarray(shape, dtype, memptr/buffer,
    strides)``-style construction through ``as_strided`` semantics).
    """
    n = raw.shape[0]
    out = {}
    offsets = spec.record_dtype.fields
    assert offsets is not None                       # a record dtype has fields
    for name, f in spec.fields.items():
        off = offsets[name][1]
        block = raw[:, off:off + f.nbytes]
        v = block.view(f.dtype)                              # (n, prod(shape))
        out[name] = v.reshape((n, *f.shape)) if f.shape else v.reshape(n)
    return out


class DeviceStorage(Storage):
    """Records on a GPU (CuPy), or on any array module given as ``xp``.

    Parameters
    ----------
    spec : ExperienceSpec
    rows : int
    device : int
        CUDA device ordinal (ignored when ``xp`` is numpy).
    xp : module, optional
        Array module; default CuPy (imported lazily).
    """

    kind = "device"

    def __init__(self, spec: ExperienceSpec, rows: int, name: str | None = None,
                 device: int = 0, xp: ModuleType | None = None):
        super().__init__(spec, rows, name)
        self.xp = import_cupy() if xp is None else xp
        self.device = device
        self._on_gpu = self.xp.__name__ == "cupy"
        with self._ctx():
            self.data = self.xp.zeros((self.rows, self.spec.itemsize), dtype=self.xp.uint8)

    def _ctx(self):
        if self._on_gpu:
            return self.xp.cuda.Device(self.device)
        import contextlib

        return contextlib.nullcontext()

    def _raw(self, records: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(records).view(np.uint8).reshape(len(records), self.spec.itemsize)

    def write_fields(self, start: int, fields: Mapping[str, np.ndarray]) -> None:
        rec = self.spec.pack(fields)
        with self._ctx():
            self.data[start:start + len(rec)] = self.xp.asarray(self._raw(rec))

    def write_records(self, rows: np.ndarray, records: np.ndarray) -> None:
        with self._ctx():
            self.data[self.xp.asarray(rows)] = self.xp.asarray(self._raw(records))

    def gather(self, rows: Any) -> Any:
        """Gather ``rows`` on the device: a ``(n, itemsize)`` uint8 array of the array module."""
        with self._ctx():
            return self.xp.take(self.data, self.xp.asarray(rows), axis=0)

    def read_records(self, rows: np.ndarray, out: np.ndarray) -> None:
        raw = self.gather(rows)
        host = out.view(np.uint8).reshape(len(out), self.spec.itemsize)
        if self._on_gpu:
            raw.get(out=host)
        else:
            host[...] = raw

    def close(self) -> None:
        self.data = self.xp.zeros((0, self.spec.itemsize), dtype=self.xp.uint8)
