"""Pipelines that misbehave on some processes only, for fault tests with real ``dask worker``s.

A process opts in through its environment, as a real broken worker would differ from the
others: ``DASK_RESEARCH_TEST_HANG`` set makes :func:`hang_on_marked` hang on the *marked*
shards (those whose first draw of ``a`` exceeds :data:`MARK`), ``DASK_RESEARCH_TEST_BROKEN``
set makes :func:`broken_here` raise ``ModuleNotFoundError`` (a worker missing a library).
Elsewhere (the client's pilot, the other workers) both compute ``tanh(a * b)``, so a result is
the same bits whichever worker computes it.

Examples
--------
>>> import numpy as np
>>> float(broken_here(np.array([0.0]), np.array([1.0]))[0])
0.0
"""
from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["hang_on_marked", "broken_here", "marked_shards", "MARK", "HANG_ENV", "BROKEN_ENV", "HANG_SECONDS"]

HANG_ENV = "DASK_RESEARCH_TEST_HANG"
BROKEN_ENV = "DASK_RESEARCH_TEST_BROKEN"
#: A shard is marked when its first draw of ``a`` exceeds this (``a ~ Normal(1, 0.1)``: about 2 %).
MARK = 1.2
#: How long a hang lasts: long enough to outlive any test, short enough never to outlive a machine.
HANG_SECONDS = 600.0


def hang_on_marked(a, b):
    """``tanh(a * b)``; on a process with ``DASK_RESEARCH_TEST_HANG`` set, a marked shard hangs."""
    if os.environ.get(HANG_ENV) and a[0] > MARK:
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return np.tanh(a * b)


def broken_here(a, b):
    """``tanh(a * b)``; on a process with ``DASK_RESEARCH_TEST_BROKEN`` set, ``ModuleNotFoundError``."""
    if os.environ.get(BROKEN_ENV):
        raise ModuleNotFoundError("No module named 'fastmath_ext' (missing on this worker)")
    return np.tanh(a * b)


def marked_shards(job) -> list[int]:
    """The shards of ``job`` that :func:`hang_on_marked` hangs on (first draw of ``a`` > MARK)."""
    from dask_research.montecarlo import philox
    from dask_research.montecarlo.evaluate import draw_inputs

    return [s for s in range(job.shards)
            if draw_inputs(job, philox.shard_generator(job.key, s), job.samples_per_shard)["a"][0] > MARK]
