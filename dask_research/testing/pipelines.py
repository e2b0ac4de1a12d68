"""Pipelines for fault tests, importable by every worker process.

Worker processes started as ``dask worker`` cannot import a project's ``tests/`` directory,
so pipelines that real-process tests send to them live here.

Examples
--------
>>> import numpy as np
>>> float(slow_tanh(np.array([0.0]), np.array([1.0]), delay=0.0)[0])
0.0
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["slow_tanh"]


def slow_tanh(a, b, delay: float = 0.05):
    """``tanh(a * b)`` after sleeping ``delay`` seconds (a shard that takes a while)."""
    time.sleep(delay)
    return np.tanh(a * b)
