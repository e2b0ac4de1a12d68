"""Waiting for Dask futures from the learner's threads, without a default client.

Examples
--------
>>> class Done:                          # anything with ``done()``, e.g. a distributed.Future
...     def done(self):
...         return True
>>> wait_all([Done(), Done()], timeout=1.0)
True
>>> wait_all([], timeout=0.0)
True
"""
from __future__ import annotations

import time
from typing import Any


def wait_all(futures: list[Any], timeout: float) -> bool:
    """Block until every Dask future is done (finished, erred or cancelled); False on timeout.

    Polls ``Future.done()`` with a backoff from 0.2 ms to 2 ms: no callback threads, no
    default client needed (``distributed.wait`` needs one and raises on cancelled futures).

    >>> class Pending:
    ...     def done(self):
    ...         return False
    >>> wait_all([Pending()], timeout=0.01)
    False
    """
    deadline = time.perf_counter() + timeout
    nap = 0.0002
    while True:
        if all(f.done() for f in futures):
            return True
        if time.perf_counter() >= deadline:
            return False
        time.sleep(nap)
        nap = min(nap * 1.5, 0.002)
