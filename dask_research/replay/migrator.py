"""The background thread that rebalances a tiered plane while its placement is stale.

Examples
--------
>>> import threading
>>> moved = threading.Event()
>>> m = Migrator(lambda n: moved.set() or 0, lambda: False, interval=0.01, batch=10)
>>> m.poke(start=True)
>>> moved.wait(5)
True
>>> m.close()
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Migrator"]


class Migrator:
    """Calls ``rebalance(batch)`` in a daemon thread after each :meth:`poke`, waiting
    ``interval`` seconds first, and again while ``pending()`` says misplaced transitions
    are left.

    Parameters
    ----------
    rebalance : callable
        ``rebalance(max_moves) -> moved``; it calls :meth:`clear` before it plans.
    pending : callable
        Whether the last round left transitions misplaced.
    interval : float
        Seconds between rounds.
    batch : int
        Most transitions one round moves.
    """

    def __init__(self, rebalance: Callable[[int], int], pending: Callable[[], bool],
                 interval: float, batch: int):
        self._rebalance = rebalance
        self._pending = pending
        self.interval = float(interval)
        self.batch = int(batch)
        self._dirty = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def poke(self, start: bool = False) -> None:
        """Placement may be stale; with ``start``, start the thread if it is not running."""
        self._dirty.set()
        if start and self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=self._loop, name="replay-migrate", daemon=True)
            self._thread.start()

    def clear(self) -> None:
        """A rebalance is planning now: pokes before this one are served."""
        self._dirty.clear()

    def _loop(self) -> None:
        while not self._closed.is_set():
            if not self._dirty.wait(0.5):
                continue
            if self._closed.wait(self.interval):
                break
            try:
                self._rebalance(self.batch)
                if self._pending():
                    self._dirty.set()         # more to move: go on next round
            except Exception:  # pragma: no cover - keep serving; the next round retries
                time.sleep(self.interval)

    def close(self) -> None:
        """Stop the thread (waits up to 5 s for a round in progress)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
