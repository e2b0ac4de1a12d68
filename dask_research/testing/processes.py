"""Helpers for tests that start and kill real processes.

Examples
--------
>>> wait_for(lambda: True, 1.0, "nothing")
"""
from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
