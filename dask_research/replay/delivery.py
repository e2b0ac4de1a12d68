"""Delivery: batches prepared ahead of the learner, and the exposed latency it sees.

``plane.batches(...)`` returns a :class:`BatchIterator`. With ``prefetch=k > 0`` a background
thread runs the pipeline

    sample (rate limiter, sampler) -> gather (per tier) -> transform (user callables)
    -> copy (to numpy / torch / CuPy, on the learner's device)

and keeps up to ``k`` finished batches in a bounded queue; ``next()`` only takes one. With
``prefetch=0`` the pipeline runs inside ``next()``. Either way every batch records its stage
times, and the iterator records the *exposed latency* (the time ``next()`` blocked) and the
learner's step time (between one ``next()`` returning and the next call), so
``plane.stats()["delivery"]["exposed_fraction"]`` says how much of the learner's time went to
waiting for data.

Copy paths:

- ``to="numpy"``: fields are zero-copy views of one freshly gathered record buffer.
- ``to="torch"`` on CPU: ``torch.from_numpy`` on those views (zero copy).
- ``to="torch"`` / ``"cupy"`` on a GPU: records are gathered into a ring of pinned host
  buffers, uploaded with one asynchronous copy per batch on a side CUDA stream, and exposed as
  typed views of the device bytes; ``next()`` makes the learner's current stream wait on the
  copy's event (no host synchronisation). A plane whose sampled rows all live in a
  :class:`DeviceTier` is gathered on the device instead and handed to torch by DLPack.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane({"x": ((2,), "float32")}, capacity=100, seed=0)
>>> _ = plane.ingest({"x": np.ones((50, 2))})
>>> with plane.batches(batch_size=4, prefetch=2, max_batches=3) as it:
...     shapes = [b.x.shape for b in it]
>>> shapes
[(4, 2), (4, 2), (4, 2)]
>>> plane.stats()["delivery"]["batches"]
3
"""
from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import config
from ..exceptions import InputError, RateLimitTimeout
from .batch import Batch
from .storages.device import field_views

if TYPE_CHECKING:  # pragma: no cover
    from .plane import ExperiencePlane

_STOP = object()
STAGES = ("rate_wait", "sample", "gather", "transform", "copy")

# --- the interpreter's thread switch interval ----------------------------------------------
# A learner thread that wants the GIL back (its GPU step or sleep finished) while the delivery
# thread runs numpy calls on small arrays waits until the delivery thread blocks, or until the
# switch interval (5 ms by default) forces a hand-over. While a prefetching iterator is open we
# lower the interval (research.replay.switch-interval, 100 us by default; null leaves it alone)
# and restore it when the last one closes.
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved: float | None = None


def _acquire_switch_interval(value: float | None) -> bool:
    global _switch_users, _switch_saved
    if value is None:
        return False
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            if value < _switch_saved:
                sys.setswitchinterval(value)
        _switch_users += 1
    return True


def _release_switch_interval() -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        _switch_users -= 1
        if _switch_users == 0 and _switch_saved is not None:
            sys.setswitchinterval(_switch_saved)
            _switch_saved = None


class DeliveryStats:
    """Exposed latency, learner step time and per-stage times of one :class:`BatchIterator`."""

    def __init__(self, prefetch: int, keep: int = 4096):
        self.prefetch = prefetch
        self.batches = 0
        self.first_batch_s = float("nan")
        self.exposed_s = 0.0          # after the first batch (steady state)
        self.exposed_max_s = 0.0
        self.step_s = 0.0
        self.steps = 0
        self.stage_s = dict.fromkeys(STAGES, 0.0)
        self.recent: collections.deque[float] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def record(self, exposed: float, step: float | None, info: dict[str, float]) -> None:
        with self._lock:
            if self.batches == 0:             # the cold start is reported on its own
                self.first_batch_s = exposed
            else:
                self.exposed_s += exposed
                self.exposed_max_s = max(self.exposed_max_s, exposed)
                self.recent.append(exposed)
                stage_s = self.stage_s
                for k, v in info.items():
                    if k in stage_s:
                        stage_s[k] += v
            if step is not None:
                self.step_s += step
                self.steps += 1
            self.batches += 1

    def summary(self) -> dict[str, Any]:
        """Means in seconds over the batches after the first (``first_batch_s``: the cold
        start); ``exposed_fraction`` = mean exposed latency / mean learner step."""
        with self._lock:
            n = max(self.batches - 1, 0)
            recent = np.array(self.recent) if self.recent else np.zeros(1)
            exposed_mean = self.exposed_s / n if n else float("nan")
            step_mean = self.step_s / self.steps if self.steps else float("nan")
            return {
                "batches": self.batches, "prefetch": self.prefetch,
                "first_batch_s": self.first_batch_s,
                "exposed_mean_s": exposed_mean,
                "exposed_p50_s": float(np.percentile(recent, 50)),
                "exposed_p99_s": float(np.percentile(recent, 99)),
                "exposed_max_s": self.exposed_max_s,
                "step_mean_s": step_mean,
                "exposed_fraction": (exposed_mean / step_mean
                                     if n and self.steps and step_mean > 0 else float("nan")),
                "stages_mean_s": {k: (v / n if n else float("nan"))
                                  for k, v in self.stage_s.items()},
            }


# --- converters ----------------------------------------------------------------------------
class _NumpyOut:
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


class _TorchCPUOut(_NumpyOut):
    def __init__(self, spec: Any, torch: Any):
        super().__init__(spec)
        self.torch = torch

    def __call__(self, rec: np.ndarray | None, batch: Batch) -> Batch:
        t = self.torch
        w = batch.weights
        return Batch({k: _torch_from_numpy(t, v) for k, v in batch.data.items()}, batch.indices,
                     None if w is None else t.from_numpy(w), batch.info)


class _TorchCUDAOut(_NumpyOut):
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


class _CupyOut(_NumpyOut):
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


def make_converter(spec: Any, to: str, device: Any, slots: int, batch_size: int) -> _NumpyOut:
    """The copy stage for ``to`` / ``device`` (imports torch or CuPy only when asked for)."""
    if to == "numpy":
        if device not in (None, "cpu"):
            raise InputError("device", device, "None or 'cpu' for to='numpy'", where="batches")
        return _NumpyOut(spec)
    if to == "torch":
        import torch

        if _is_cuda(device):
            return _TorchCUDAOut(spec, torch, device, slots, batch_size)
        if device not in (None, "cpu") and str(device) != "cpu":
            raise InputError("device", device, "'cpu' or 'cuda[:n]'", where="batches")
        return _TorchCPUOut(spec, torch)
    if to == "cupy":
        return _CupyOut(spec, device, slots, batch_size)
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


def _bool_as_dtype(bool_as: Any) -> np.dtype:
    """The dtype bool fields are delivered as (``bool_as=``): a numeric numpy dtype."""
    try:
        dt = np.dtype(bool_as)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "iuf":
        raise InputError("bool_as", bool_as, "None or a numeric dtype such as 'float32' "
                         "(bool fields then come out as 0/1 numbers)", where="batches")
    return dt


def drain_and_join(thread: threading.Thread, q: queue.Queue) -> None:
    """Join a producer thread, emptying its bounded queue so a blocked ``put`` can finish."""
    while thread.is_alive():
        try:
            q.get_nowait()
        except queue.Empty:
            pass
        thread.join(timeout=0.05)


class PrefetchingIterator:
    """The learner's end of a prefetch queue that a background thread fills.

    What :class:`BatchIterator` and the cluster plane's ``ClusterBatchIterator`` share: taking
    an item off the queue (the stop marker ends the iteration, a forwarded error is raised),
    handing a batch over with its delivery figures, putting items until the iterator is
    closed, and an idempotent :meth:`close`. Subclasses set ``closed``, ``convert``,
    ``stats``, ``_queue``, ``_thread``, ``_stop``, ``_switch`` and ``_last_return``.
    """

    closed: bool
    convert: Any
    stats: DeliveryStats
    _queue: queue.Queue | None
    _thread: threading.Thread | None
    _stop: threading.Event
    _switch: bool
    _last_return: float | None

    def __iter__(self) -> PrefetchingIterator:
        return self

    def _clock(self) -> tuple[float, float | None]:
        """``(t_call, step)``: now, and the learner's time since the last batch returned."""
        t_call = time.perf_counter()
        return t_call, None if self._last_return is None else t_call - self._last_return

    # --- hand-over ------------------------------------------------------------------------
    # A learner that finds the queue empty blocks in ``get`` (releasing the GIL). The producer
    # puts the batch and would then go on preparing the next one while holding the GIL (numpy
    # calls on small arrays do not release it), so the woken learner would wait for the
    # interpreter's switch interval before it could return: that wait, not the work, was most
    # of ``next()``. So when the learner is waiting, the producer blocks on ``_taken`` right
    # after the put until the learner has taken the batch (or 50 ms): the GIL goes to the
    # learner at once. A learner that finds a batch ready costs the producer nothing.
    _waiting = False
    _taken_lock: Any = None               # created by the producer thread on its first put

    def _take(self) -> Any:
        """The next queued item; closes on the stop marker or a forwarded error."""
        assert self._queue is not None
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            self._waiting = True
            try:
                item = self._queue.get()
            finally:
                self._waiting = False
            lock = self._taken_lock
            if lock is not None and lock.locked():
                try:
                    lock.release()        # the producer may go on
                except RuntimeError:      # pragma: no cover - released concurrently
                    pass
        if item is _STOP:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def _hand_over(self, batch: Batch, t_call: float, step: float | None,
                   info: dict[str, float]) -> Batch:
        """Mark ``batch`` ready for the learner and record the call's delivery figures."""
        self.convert.ready(batch)
        t_ret = time.perf_counter()
        self.stats.record(t_ret - t_call, step, info)
        self._last_return = t_ret
        return batch

    def _on_full(self) -> None:
        """Called by :meth:`_put` while the queue is full (the learner is behind)."""

    def _put(self, item: Any) -> None:
        """Queue ``item``, waiting while the queue is full, until the iterator is closed."""
        assert self._queue is not None
        lock = self._taken_lock
        if lock is None:
            lock = self._taken_lock = threading.Lock()
        lock.acquire(blocking=False)      # locked: no batch taken since this put
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
            except queue.Full:
                self._on_full()
                continue
            if self._waiting:             # the learner is blocked on this very batch
                lock.acquire(timeout=0.05)
            return

    def close(self) -> None:
        """Stop the background pipeline (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._switch:
            self._switch = False
            _release_switch_interval()
        if self._thread is not None:
            assert self._queue is not None
            drain_and_join(self._thread, self._queue)

    def __enter__(self) -> PrefetchingIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BatchIterator(PrefetchingIterator):
    """Iterator over prefetched batches; see :meth:`ExperiencePlane.batches`.

    Batches are fresh arrays (the pinned staging buffers of the GPU path are recycled only
    after their upload completed), so a learner may keep a batch as long as it likes.
    """

    def __init__(self, plane: ExperiencePlane, batch_size: int | None = None,
                 prefetch: int | None = None, to: str = "numpy", device: Any = None,
                 transforms: Sequence[Callable] = (), max_batches: int | None = None,
                 timeout: float | None = None, switch_interval: float | None = None,
                 bool_as: Any = None):
        self.plane = plane
        self.bool_as = None if bool_as is None else _bool_as_dtype(bool_as)
        self.batch_size = int(config.get("replay.batch-size", batch_size))
        self.prefetch = int(config.get("replay.prefetch", prefetch))
        if self.batch_size < 1:
            raise InputError("batch_size", batch_size, "a positive integer", where="batches")
        if self.prefetch < 0:
            raise InputError("prefetch", prefetch, "an integer >= 0", where="batches")
        if timeout is None and plane.rate_limiter is not None:
            timeout = plane.rate_limiter.timeout       # the limiter's own, not the global one
        self.timeout = float(config.get("replay.rate-timeout", timeout))
        self.max_batches = max_batches
        self.transforms = list(transforms)
        for f in self.transforms:
            if not callable(f):
                raise InputError("transforms", f, "callables taking and returning a Batch",
                                 where="batches")
            bind = getattr(f, "bind", None)
            if callable(bind):
                bind(plane)
        self.convert = make_converter(plane.spec, to, device, self.prefetch + 2, self.batch_size)
        self.to, self.device = to, device
        self._staging = getattr(self.convert, "staging", None)
        self._whole = not self.transforms and self.bool_as is None   # records go out as gathered
        self._convert_needed = type(self.convert) is not _NumpyOut     # numpy: the batch as is
        self._names = plane.spec.names
        self.stats = DeliveryStats(self.prefetch)
        self._drawn = 0                   # batches drawn (numbered under the plane's lock)
        self._delivered = 0
        self._last_return: float | None = None
        self._stop = threading.Event()
        self.closed = False
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._switch = False
        # The learner thread may produce a batch itself when the queue is empty (see
        # __next__) where the pipeline is safe to run in two threads: the plane's own stages,
        # host output (numpy, torch on CPU), no rate limiter to wait on, no user transforms.
        self._inline_ok = (self.prefetch > 0 and type(self.convert) in (_NumpyOut, _TorchCPUOut)
                           and not self.transforms and plane.rate_limiter is None)
        self._demand = threading.Event()   # set: the producer thread may prepare batches
        self._demand.set()
        self._step_ewma: float | None = None   # the learner's step time, a moving average
        self._made_ewma = 0.0              # the time to make one batch, a moving average
        if self.prefetch > 0:
            si = config.get("replay.switch-interval", switch_interval, default=None)
            if si is not None and not si > 0:
                raise InputError("switch_interval", si, "a positive number of seconds or None",
                                 where="batches")
            self._switch = _acquire_switch_interval(si)
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(target=self._run, name="replay-delivery", daemon=True)
            self._thread.start()

    # --- pipeline ----------------------------------------------------------------------
    def _await_sample(self, info: dict[str, float]) -> None:
        rl = self.plane.rate_limiter
        if rl is None:
            return
        t0 = time.perf_counter()
        deadline = t0 + self.timeout
        while True:
            try:
                rl.await_sample(self.batch_size, timeout=min(0.1, max(deadline - time.perf_counter(), 0)))
                break
            except RateLimitTimeout:
                if self._stop.is_set():
                    raise
                if time.perf_counter() >= deadline:
                    raise RateLimitTimeout("sample", rl.inserts, rl.samples,
                                           rl.samples_per_insert, self.timeout)
        info["rate_wait"] = time.perf_counter() - t0

    def _produce_here(self, inline: bool = False) -> Any:
        """A batch made in the learner's thread; the iterator closes on an error or the end."""
        try:
            batch = self._produce(inline=inline)
        except BaseException:
            self.close()
            raise
        if batch is _STOP:
            self.close()
            raise StopIteration
        return batch

    def _produce(self, inline: bool = False) -> Any:
        """Draw, gather, transform and convert batch number ``self._drawn``.

        Returns the batch, or ``_STOP`` once ``max_batches`` were drawn. With ``inline`` (the
        learner found the queue empty) the batch is drawn only if it is the one the learner
        waits for, i.e. the producer thread has none in flight; else None. Batch numbers are
        taken under the plane's lock together with the draw, so batch ``k`` always holds the
        ``k``-th draw from the plane's generator, whichever thread made it.
        """
        info: dict[str, float] = {}
        mx = self.max_batches
        if not inline and mx is not None and self._drawn >= mx:
            return _STOP                  # (inline: the learner may still wait for one in flight)
        plane = self.plane
        if plane.rate_limiter is not None:
            self._await_sample(info)
        whole = self._whole
        gpu = self._staging is not None and whole
        out = self._staging() if gpu else None
        with plane._lock:
            seq = self._drawn
            if inline and seq != self._delivered:
                return None
            if mx is not None and seq >= mx:
                return _STOP
            self._drawn = seq + 1
            rec, keys, weights = plane._draw(self.batch_size, out, info, gpu)
        if not isinstance(rec, np.ndarray):     # gathered on the GPU: no host round trip
            t0 = time.perf_counter()
            batch = self.convert.from_device(rec, keys, weights, info)
            info["transform"] = 0.0
            info["copy"] = time.perf_counter() - t0
            batch.info = info
            return batch
        if plane.rate_limiter is not None:
            plane.rate_limiter.sampled(self.batch_size)
        t0 = time.perf_counter()
        batch = Batch({n: rec[n] for n in self._names}, keys, weights, info)
        for f in self.transforms:
            r = f(batch)
            if r is not None:
                batch = r if isinstance(r, Batch) else Batch(dict(r), keys, batch.weights, info)
        if self.bool_as is not None:
            bd = self.bool_as
            for k, v in batch.data.items():
                if v.dtype == np.bool_:
                    batch.data[k] = v.astype(bd)
        t1 = time.perf_counter()
        if self._convert_needed:
            batch = self.convert(rec if whole else None, batch)
        t2 = time.perf_counter()
        info["transform"] = t1 - t0
        info["copy"] = t2 - t1
        batch.info = info
        return batch

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._inline_ok and not self._demand.is_set():
                    # the learner is inside next() and makes the batch itself: competing
                    # with it for the GIL would only add thread switches
                    self._demand.wait(0.1)
                    continue
                item = self._produce()
                self._put(item)
                if item is _STOP:
                    return
        except BaseException as e:  # forwarded to the learner's next()
            self._put(e)

    # --- iterator ------------------------------------------------------------------------
    def __next__(self) -> Batch:
        if self.closed:
            raise StopIteration
        t_call = time.perf_counter()
        last = self._last_return
        step = None if last is None else t_call - last
        if self._queue is None:
            if self.max_batches is not None and self._delivered >= self.max_batches:
                self.close()
                raise StopIteration
            batch = self._produce_here()
        else:
            batch = None
            inline = self._inline_ok
            if inline and self._demand.is_set():
                self._demand.clear()
            if inline and not self._queue.qsize():
                # The learner outpaces the producer thread. Handing a batch from one thread
                # to the other costs two thread wake-ups and a GIL hand-over (most of next()
                # on a busy machine); producing the wanted batch here costs neither.
                batch = self._produce_here(inline=True)
            if batch is None:
                batch = self._take()
        self._delivered += 1
        if self._inline_ok:
            # Wake the producer thread for the learner's step only when that step is long
            # enough for prefetching to pay for the thread switch (a learner that calls next()
            # right away is served faster inline, without the producer fighting for the GIL).
            info = batch.info
            made = (info.get("sample", 0.0) + info.get("gather", 0.0) + info.get("copy", 0.0))
            self._made_ewma += 0.2 * (made - self._made_ewma)
            if step is not None:
                # clipped, so that one long pause (the OS ran another process) does not wake
                # the producer for the steps after it
                st = min(step, 2.0 * self._made_ewma)
                ew = self._step_ewma
                self._step_ewma = st if ew is None else ew + 0.2 * (st - ew)
            if self._step_ewma is None or self._step_ewma >= 0.5 * self._made_ewma:
                self._demand.set()
        if self._convert_needed:
            self.convert.ready(batch)
        t_ret = time.perf_counter()
        self.stats.record(t_ret - t_call, step, batch.info)
        self._last_return = t_ret
        return batch

    def close(self) -> None:
        """Stop the background pipeline (idempotent)."""
        self._stop.set()
        self._demand.set()                # a producer waiting for demand wakes and sees stop
        super().close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._stop.set()
            if self._switch:
                self._switch = False
                _release_switch_interval()
        except Exception:
            pass
