"""Bounded experiments: per-experiment timeouts, and threads that can be abandoned.

Two mechanisms keep :meth:`IterationScheduler.run` from hanging on a runner that never returns:

- ``timeout`` (``research.experiments.timeout``): an experiment that runs longer is cancelled
  and recorded as a failed experiment (:class:`ExperimentTimeout`), which the branch statistics
  count as any other failure (the failure limit, the failure event, the journal).
- ``max_seconds`` bounds the whole run: dispatching stops when it passes, and experiments
  still in flight ``cancel_grace`` seconds later (``research.experiments.cancel-grace``) are
  cancelled. They are not counted (they did not fail); the report lists them
  (``Report.cancelled``), the trace has a ``cancel`` event for each, and the next ``run()``
  (or a resume from the checkpoint) dispatches them again first.

What cancelling means depends on where the experiment runs. An ``async def`` runner's task is
cancelled (``CancelledError`` at its next ``await``). A Dask future is cancelled with
``Client.cancel``; a task already executing on a worker keeps its worker thread until the
function returns (Dask cannot interrupt a running Python function either). A sync runner in
this process runs in a thread that cannot be killed: :class:`AbandonablePool` abandons it (the
slot gets a fresh thread at once, and the stuck thread exits whenever the call returns); its
threads are daemons, so an abandoned thread never blocks the interpreter's exit, but it keeps
whatever it holds (CPU, memory, open files, locks) until it returns.

Examples
--------
>>> import threading
>>> pool, started, never = AbandonablePool(1), threading.Event(), threading.Event()
>>> stuck = pool.submit(lambda: started.set() or never.wait(5))
>>> started.wait(5) and pool.abandon(stuck)   # a fresh thread takes the slot
True
>>> pool.submit(lambda: "next").result(5)
'next'
>>> pool.shutdown()
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["AbandonablePool", "ExperimentTimeout", "Deadlines"]


class ExperimentTimeout(Exception):
    """An experiment ran longer than the per-experiment timeout (recorded as a failure)."""


class AbandonablePool:
    """A pool of ``size`` daemon threads in which a stuck call can be abandoned.

    ``submit`` returns a :class:`concurrent.futures.Future`. ``abandon(future)`` gives up a
    call that is running: the pool starts a replacement thread, and the thread running the
    call exits when the call returns, so ``size`` threads keep serving the queue.
    """

    def __init__(self, size: int, name: str = "experiment"):
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Future, threading.Thread] = {}
        self._abandoned: set[Future] = set()
        self._threads = 0
        self._closed = False
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        self._threads += 1
        t = threading.Thread(target=self._work, daemon=True,
                             name=f"{self.name}-{self._threads}")
        t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running[fut] = me
            try:
                out = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                fut.set_exception(exc)
            else:
                fut.set_result(out)
            with self._lock:
                self._running.pop(fut, None)
                if fut in self._abandoned:           # replaced meanwhile: this thread goes
                    self._abandoned.discard(fut)
                    return

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a pool thread."""
        if self._closed:
            raise RuntimeError("the pool is shut down")
        fut: Future = Future()
        self._queue.put((fut, fn, args))
        return fut

    def abandon(self, fut: Future) -> bool:
        """Give up ``fut``: cancel it if it has not started, else replace its thread.

        Returns True if a thread was abandoned (the call is still running in it).
        """
        if fut.cancel():
            return False
        with self._lock:
            if fut not in self._running or fut in self._abandoned:
                return False
            self._abandoned.add(fut)
            if not self._closed:
                self._spawn()
            return True

    @property
    def abandoned(self) -> int:
        """Calls abandoned and still running."""
        with self._lock:
            return len(self._abandoned)

    def shutdown(self) -> None:
        """Let each thread exit after the calls already queued (cancelled ones are skipped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = self._threads
        for _ in range(live):
            self._queue.put(None)


class Deadlines:
    """Per-experiment deadlines of the driver: ``token -> time by which it must finish``."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self._due: dict[Any, float] = {}

    def start(self, token: Any, now: float) -> None:
        if self.timeout is not None:
            self._due[token] = now + self.timeout

    def start_by(self, token: Any, now: float) -> None:
        """Start ``token``'s clock now unless it has started already."""
        if self.timeout is not None:
            self._due.setdefault(token, now + self.timeout)

    def discard(self, token: Any) -> None:
        self._due.pop(token, None)

    def next_in(self, now: float) -> float | None:
        """Seconds until the next deadline (``None``: none)."""
        if not self._due:
            return None
        return max(0.0, min(self._due.values()) - now)

    def expired(self, now: float) -> list[Any]:
        """Tokens past their deadline, earliest first."""
        out = sorted((due, k) for k, (token, due) in enumerate(self._due.items()) if due <= now)
        tokens = list(self._due)
        return [tokens[k] for _, k in out]
