"""The learner's end of a prefetch queue that a background thread fills, and the interpreter's
thread switch interval while one is open.

What :class:`~dask_research.replay.BatchIterator` and the cluster plane's
``ClusterBatchIterator`` share: the stop marker, taking an item off the queue, handing a batch
over with its delivery figures, putting items until the iterator is closed, joining the
producer thread.

Examples
--------
>>> import queue, threading
>>> q = queue.Queue(maxsize=1)
>>> t = threading.Thread(target=q.put, args=(1,)); t.start()
>>> drain_and_join(t, q); t.is_alive()
False
>>> _acquire_switch_interval(None)       # None: the interpreter is left alone
False
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any

from .batch import Batch
from .stats import DeliveryStats

__all__ = ["PrefetchingIterator", "drain_and_join"]

#: put on the queue after the last batch
_STOP = object()

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
    _took_ready = False                   # the last _take found its item already queued

    def _take(self) -> Any:
        """The next queued item; closes on the stop marker or a forwarded error."""
        assert self._queue is not None
        try:
            item = self._queue.get_nowait()
            self._took_ready = True
        except queue.Empty:
            self._took_ready = False
            self._waiting = True
            try:
                while True:
                    try:
                        item = self._queue.get(timeout=0.1)
                        break
                    except queue.Empty:
                        # closed from another thread (plane.close()): the producer puts
                        # nothing more, so waiting on would block the learner for ever
                        if self._stop.is_set():
                            item = _STOP
                            break
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
        self.stats.record(t_ret - t_call, step, info, ready=self._took_ready)
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
