"""The copy stage of delivery: batches out as numpy, torch (CPU or CUDA) or CuPy.

:func:`make_converter` picks one for ``batches(to=..., device=...)`` and imports torch or CuPy
only when asked for:

- ``to="numpy"``: fields are zero-copy views of one freshly gathered record buffer.
- ``to="torch"`` on CPU: ``torch.from_numpy`` on those views (zero copy).
- ``to="torch"`` / ``"cupy"`` on a GPU: records are gathered into a ring of pinned host
  buffers, uploaded with one asynchronous copy per batch on a side CUDA stream, and exposed as
  typed views of the device bytes; ``ready()`` makes the learner's current stream wait on the
  copy's event (no host synchronisation). Rows gathered on a device tier already are handed
  over by DLPack (``from_device``).

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import Batch, ExperienceSpec
>>> out = make_converter(ExperienceSpec({"x": ((), "float32")}), "numpy", None, 2, 4)
>>> b = Batch({"x": np.zeros(4, "float32")}, np.arange(4))
>>> out(None, b) is b, bool_as_dtype("float32")
(True, dtype('float32'))
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..exceptions import InputError
from .batch import Batch
from .storages.device import field_views

__all__ = ["NumpyOut", "TorchCPUOut", "TorchCUDAOut", "CupyOut", "make_converter",
           "tensordict_output", "bool_as_dtype"]


class NumpyOut:
    def __init__(self, spec: Any):
        self.spec = spec

    def __call__(self, rec: np.ndarray | None, batch: Batch) -> Batch:
        return batch

    def ready(self, batch: Batch) -> None:
        pass


def _torch_from_numpy(torch: Any, a: np.ndarray) -> Any:
    try:
        return torch.from_numpy(a)
    except (ValueError, TypeError, RuntimeError):       # odd strides or read-only memory
        return torch.from_numpy(np.ascontiguousarray(a).copy())


class TorchCPUOut(NumpyOut):
    def __init__(self, spec: Any, torch: Any):
        super().__init__(spec)
        self.torch = torch

    def __call__(self, rec: np.ndarray | None, batch: Batch) -> Batch:
        t = self.torch
        w = batch.weights
        return Batch({k: _torch_from_numpy(t, v) for k, v in batch.data.items()}, batch.indices,
                     None if w is None else t.from_numpy(w), batch.info)


class TorchCUDAOut(NumpyOut):
    """Pinned staging ring + side stream + one async upload per batch."""

    def __init__(self, spec: Any, torch: Any, device: Any, slots: int, batch_size: int):
        super().__init__(spec)
        self.torch = torch
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self.slots = slots
        self.pinned = [torch.empty((batch_size, spec.itemsize), dtype=torch.uint8, pin_memory=True)
                       for _ in range(slots)]
        self.events: list[Any] = [None] * slots
        self.i = 0
        self._dtypes = {n: torch.from_numpy(np.empty(0, f.dtype)).dtype
                        for n, f in spec.fields.items()}

    def staging(self) -> np.ndarray:
        """The next pinned buffer as a host record array (waits until its last copy is done)."""
        k = self.i % self.slots
        ev = self.events[k]
        if ev is not None:
            ev.synchronize()
        return self.pinned[k].numpy().view(self.spec.record_dtype).reshape(-1)

    def _views(self, raw: Any) -> dict[str, Any]:
        out = {}
        n = raw.shape[0]
        for name, f in self.spec.fields.items():
            off = self.spec.record_dtype.fields[name][1]
            v = raw[:, off:off + f.nbytes].view(self._dtypes[name])
            out[name] = v.reshape((n, *f.shape)) if f.shape else v.reshape(n)
        return out

    def __call__(self, rec: np.ndarray | None, batch: Batch) -> Batch:
        t = self.torch
        k = self.i % self.slots
        self.i += 1
        with t.cuda.stream(self.stream):
            if rec is not None:                          # one upload of the whole record buffer
                dev = self.pinned[k][: len(rec)].to(self.device, non_blocking=True)
                data = self._views(dev)
            else:                                        # transformed fields: one upload each
                data = {n: t.from_numpy(np.ascontiguousarray(a)).pin_memory()
                        .to(self.device, non_blocking=True) for n, a in batch.data.items()}
            w = batch.weights
            w = None if w is None else t.from_numpy(w).pin_memory().to(self.device, non_blocking=True)
            ev = t.cuda.Event()
            ev.record(self.stream)
        self.events[k] = ev
        out = Batch(data, batch.indices, w, batch.info)
        out.info["_event"] = ev
        return out

    def from_device(self, raw: Any, keys: np.ndarray, weights: Any, info: dict) -> Batch:
        """Records gathered by CuPy on the GPU: to torch by DLPack, zero copy."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()     # the gather ran on CuPy's stream
        dev = self.torch.from_dlpack(raw)
        w = None if weights is None else self.torch.from_numpy(weights).to(self.device)
        return Batch(self._views(dev), keys, w, info)

    def ready(self, batch: Batch) -> None:
        """On the consumer thread: the learner's stream waits for the upload (no host sync)."""
        ev = batch.info.pop("_event", None)
        if ev is None:
            return
        cur = self.torch.cuda.current_stream(self.device)
        cur.wait_event(ev)
        for v in list(batch.data.values()) + ([batch.weights] if batch.weights is not None else []):
            try:
                v.record_stream(cur)      # allocated on the side stream: keep it alive for cur
            except RuntimeError:          # pragma: no cover - memory not from torch's allocator
                pass


class CupyOut(NumpyOut):
    """Pinned staging ring + CuPy stream; fields are typed views of the uploaded bytes."""

    def __init__(self, spec: Any, device: Any, slots: int, batch_size: int):
        super().__init__(spec)
        from .storages.device import import_cupy

        self.cp = import_cupy()
        self.device = 0 if device in (None, "cuda") else int(str(device).split(":")[-1])
        with self.cp.cuda.Device(self.device):
            self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.slots = slots
        self.pinned = [self.cp.cuda.alloc_pinned_memory(batch_size * spec.itemsize)
                       for _ in range(slots)]
        self.events: list[Any] = [None] * slots
        self.i = 0
        self.batch_size = batch_size

    def staging(self) -> np.ndarray:
        k = self.i % self.slots
        if self.events[k] is not None:
            self.events[k].synchronize()
        return np.frombuffer(self.pinned[k], dtype=self.spec.record_dtype, count=self.batch_size)

    def __call__(self, rec: np.ndarray | None, batch: Batch) -> Batch:
        cp = self.cp
        k = self.i % self.slots
        self.i += 1
        with cp.cuda.Device(self.device), self.stream:
            if rec is not None:
                raw = cp.empty((len(rec), self.spec.itemsize), dtype=cp.uint8)
                raw.set(rec.view(np.uint8).reshape(len(rec), -1), stream=self.stream)
                data = field_views(self.spec, raw, cp)
            else:
                data = {n: cp.asarray(np.ascontiguousarray(a)) for n, a in batch.data.items()}
            w = None if batch.weights is None else cp.asarray(batch.weights)
            ev = self.stream.record()
        self.events[k] = ev
        out = Batch(data, batch.indices, w, batch.info)
        out.info["_event"] = ev
        return out

    def from_device(self, raw: Any, keys: np.ndarray, weights: Any, info: dict) -> Batch:
        """Records gathered on the GPU already: typed views, no copy."""
        ev = self.cp.cuda.get_current_stream().record()
        w = None if weights is None else self.cp.asarray(weights)
        info["_event"] = ev
        return Batch(field_views(self.spec, raw, self.cp), keys, w, info)

    def ready(self, batch: Batch) -> None:
        ev = batch.info.pop("_event", None)
        if ev is not None:
            self.cp.cuda.get_current_stream().wait_event(ev)


def _is_cuda(device: Any) -> bool:
    return device is not None and str(device).startswith("cuda")


def make_converter(spec: Any, to: str, device: Any, slots: int, batch_size: int) -> NumpyOut:
    """The copy stage for ``to`` / ``device`` (imports torch or CuPy only when asked for)."""
    if to == "numpy":
        if device not in (None, "cpu"):
            raise InputError("device", device, "None or 'cpu' for to='numpy'", where="batches")
        return NumpyOut(spec)
    if to == "torch":
        import torch

        if _is_cuda(device):
            return TorchCUDAOut(spec, torch, device, slots, batch_size)
        if device not in (None, "cpu") and str(device) != "cpu":
            raise InputError("device", device, "'cpu' or 'cuda[:n]'", where="batches")
        return TorchCPUOut(spec, torch)
    if to == "cupy":
        return CupyOut(spec, device, slots, batch_size)
    raise InputError("to", to, "'numpy', 'torch', 'cupy' or 'tensordict'", where="batches")


def _same(it: Any) -> Any:
    return it


def tensordict_output(to: str) -> tuple[Callable[[Any], Any], str]:
    """``(wrap, to)`` for a ``batches(to=...)`` call: ``to="tensordict"`` delivers torch tensors
    and wraps the iterator so that it yields ``TensorDict`` (needs ``torch`` and ``tensordict``)."""
    if to != "tensordict":
        return _same, to
    try:
        from .integrations.tensordict import TensorDictBatches
    except ImportError as e:
        raise InputError("to", to, f"an output whose package is installed ({e.name or e} is missing: "
                         "pip install tensordict)", where="batches") from None
    return TensorDictBatches, "torch"


def bool_as_dtype(bool_as: Any) -> np.dtype:
    """The dtype bool fields are delivered as (``bool_as=``): a numeric numpy dtype."""
    try:
        dt = np.dtype(bool_as)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "iuf":
        raise InputError("bool_as", bool_as, "None or a numeric dtype such as 'float32' "
                         "(bool fields then come out as 0/1 numbers)", where="batches")
    return dt
