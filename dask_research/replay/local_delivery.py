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
waiting for data; ``ready`` counts the batches that were waiting in the queue when the
learner asked (the trace of prefetching doing its job).

The iterator draws from a :class:`~dask_research.replay.source.BatchSource` (the plane's
``draw``, lock, spec and rate limiter) and nothing else of the plane. The copy paths are
:mod:`~dask_research.replay.converters`; the queue hand-over is
:mod:`~dask_research.replay.prefetch`. A plane whose sampled rows all live in a
:class:`DeviceTier` is gathered on the device and handed to torch by DLPack.

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

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import config
from ..exceptions import InputError, RateLimitTimeout
from .batch import Batch
from .converters import NumpyOut, TorchCPUOut, bool_as_dtype, make_converter
from .converters import tensordict_output as tensordict_output
from .prefetch import _STOP, PrefetchingIterator, _acquire_switch_interval, _release_switch_interval
from .source import BatchSource
from .stats import DeliveryStats

# (``make_converter``, ``tensordict_output``, ``DeliveryStats``, ``PrefetchingIterator``,
# ``_STOP`` and ``_acquire_switch_interval`` are imported from here by the cluster plane.)
__all__ = ["BatchIterator", "DeliveryStats", "PrefetchingIterator", "make_converter",
           "tensordict_output"]


def seconds(name: str, value: Any) -> float:
    """``value`` as a float if it is a number of seconds > 0; else an :class:`InputError`."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not value > 0:
        raise InputError(name, value, "a number of seconds > 0", where="batches")
    return float(value)


def whole_number(name: str, value: Any, least: int, expected: str, where: str = "batches") -> int:
    """``value`` as an int if it is a whole number >= ``least`` (not a bool, not 2.5, not a
    string); else an :class:`InputError` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise InputError(name, value, expected, where=where)
    return int(value)


class BatchIterator(PrefetchingIterator):
    """Iterator over prefetched batches; see :meth:`ExperiencePlane.batches`.

    Batches are fresh arrays (the pinned staging buffers of the GPU path are recycled only
    after their upload completed), so a learner may keep a batch as long as it likes.

    ``switch_interval`` (default ``research.replay.switch-interval``, 100 us) lowers the
    interpreter's thread switch interval while a prefetching iterator is open, so that the
    learner never waits the default 5 ms for the GIL held by the delivery thread; ``None``
    in the config leaves the interpreter alone.

    With ``prefetch > 0``, a learner that asks for a batch while the delivery thread has none
    ready or in progress gets one made in its own thread (the next draw: the seeded sequence
    of batches is the same); this needs no user transforms and no rate limiter, and output
    to numpy or torch on CPU.
    """

    def __init__(self, source: BatchSource, batch_size: int | None = None,
                 prefetch: int | None = None, to: str = "numpy", device: Any = None,
                 transforms: Sequence[Callable] = (), max_batches: int | None = None,
                 timeout: float | None = None, switch_interval: float | None = None,
                 bool_as: Any = None):
        self.source = source
        self.bool_as = None if bool_as is None else bool_as_dtype(bool_as)
        self.batch_size = whole_number("batch_size", config.resolve("replay.batch-size", batch_size),
                                       1, "a positive integer")
        self.prefetch = whole_number("prefetch", config.resolve("replay.prefetch", prefetch), 0,
                                     "an integer >= 0")
        if timeout is None and source.rate_limiter is not None:
            timeout = source.rate_limiter.timeout       # the limiter's own, not the global one
        self.timeout = seconds("timeout", config.resolve("replay.rate-timeout", timeout))
        self.max_batches = (None if max_batches is None else
                            whole_number("max_batches", max_batches, 0, "None or an integer >= 0"))
        self.transforms = list(transforms)
        for f in self.transforms:
            if not callable(f):
                raise InputError("transforms", f, "callables taking and returning a Batch",
                                 where="batches")
            bind = getattr(f, "bind", None)
            if callable(bind):
                bind(source)
        self.convert = make_converter(source.spec, to, device, self.prefetch + 2, self.batch_size)
        self.to, self.device = to, device
        self._staging = getattr(self.convert, "staging", None)
        self._whole = not self.transforms and self.bool_as is None   # records go out as gathered
        self._convert_needed = type(self.convert) is not NumpyOut     # numpy: the batch as is
        self._names = source.spec.names
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
        self._inline_ok = (self.prefetch > 0 and type(self.convert) in (NumpyOut, TorchCPUOut)
                           and not self.transforms and source.rate_limiter is None)
        self._demand = threading.Event()   # set: the producer thread may prepare batches
        self._demand.set()
        self._step_ewma: float | None = None   # the learner's step time, a moving average
        self._made_ewma = 0.0              # the time to make one batch, a moving average
        if self.prefetch > 0:
            si = config.resolve("replay.switch-interval", switch_interval, default=None)
            if si is not None and not si > 0:
                raise InputError("switch_interval", si, "a positive number of seconds or None",
                                 where="batches")
            self._switch = _acquire_switch_interval(si)
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(target=self._run, name="replay-delivery", daemon=True)
            self._thread.start()

    # --- pipeline ----------------------------------------------------------------------
    def _await_sample(self, info: dict[str, float]) -> None:
        rl = self.source.rate_limiter
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
        src = self.source
        if src.rate_limiter is not None:
            self._await_sample(info)
        whole = self._whole
        staging = self._staging
        gpu = staging is not None and whole
        out = staging() if staging is not None and whole else None
        with src.lock:
            seq = self._drawn
            if inline and seq != self._delivered:
                return None
            if mx is not None and seq >= mx:
                return _STOP
            self._drawn = seq + 1
            rec, keys, weights, _ = src.draw(self.batch_size, out, info, gpu)
        if not isinstance(rec, np.ndarray):     # gathered on the GPU: no host round trip
            t0 = time.perf_counter()
            batch = self.convert.from_device(rec, keys, weights, info)
            info["transform"] = 0.0
            info["copy"] = time.perf_counter() - t0
            batch.info = info
            return batch
        if src.rate_limiter is not None:
            src.rate_limiter.sampled(self.batch_size)
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
            ready = False
        else:
            batch = None
            ready = False
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
                ready = self._took_ready
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
        self.stats.record(t_ret - t_call, step, batch.info, ready)
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
