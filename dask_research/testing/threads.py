"""Run a call in a background thread and keep what it returned or raised.

For tests that act on the world (kill a worker, freeze a process, make a FIFO) while a run is
in flight, and that must fail instead of hanging when the run does not end.

Examples
--------
>>> t, out = in_thread(lambda: 6 * 7, join=5)
>>> t.is_alive(), out
(False, {'result': 42})
>>> t, out = in_thread(lambda: 1 / 0, join=5)
>>> type(out["error"]).__name__
'ZeroDivisionError'
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["in_thread"]


def in_thread(fn: Callable[[], Any], join: float | None = None) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``fn()`` in a daemon thread; returns ``(thread, out)``.

    ``out`` gets ``"result"`` when ``fn`` returns or ``"error"`` (any exception, for the test to
    report) when it raises. With ``join``, wait up to that many seconds before returning: the
    caller checks ``thread.is_alive()`` to tell a hang from an answer.
    """
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    if join is not None:
        t.join(join)
    return t, out
