"""Synthetic actors for tests and benchmarks of the cluster plane (importable by workers).

:func:`synthetic_actor` ingests random CartPole-shaped transitions into its worker's shard
in chunks, for ``seconds`` or until a :class:`distributed.Event` is set, and reports how many
it wrote. It stands in for environment actors where only the data plane is measured.

Examples
--------
>>> from dask_research.testing.rl import cartpole_batch
>>> b = cartpole_batch(8, start=0)
>>> b["obs"].shape, b["action"].tolist()[:3]
((8, 4), [0, 1, 0])
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import numpy as np


def cartpole_batch(n: int, start: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` random CartPole-shaped transitions (actions alternate 0, 1, ...)."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": (np.arange(start, start + n) % 2).astype(np.int64),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "done": rng.random(n) < 0.05}


def synthetic_actor(plane: str, seconds: float, chunk: int = 1024, rate: float | None = None,
                    stop_event: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Ingest ``chunk`` transitions at a time into the local shard for ``seconds`` (at most
    ``rate`` transitions/s if given; stops early when the named ``distributed.Event`` is set).
    Returns ``{"worker", "ingested", "seconds"}``."""
    from distributed import Event, secede

    from ..replay.cluster import local_shard

    shard = local_shard(plane)
    secede()                                  # long-running: free the worker's thread slot
    ev = Event(stop_event) if stop_event else None
    batch = cartpole_batch(chunk, seed=seed)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        shard.ingest(batch)
        n += chunk
        if rate:
            ahead = n / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        if ev is not None and n % (chunk * 16) == 0 and ev.is_set():
            break
    return {"worker": shard.address, "ingested": n, "seconds": time.perf_counter() - t0}


def learner_on_worker(plane: str, spec: dict, n_batches: int, batch_size: int = 100) -> dict:
    """Run a learner *as a task*: a ``ClusterPlane`` attached to existing plane ``plane``
    (same name) draws ``n_batches``; returns the shard ids drawn, this worker's shard id and
    the delivery summary (``local_draws``: parts served in-process, ``remote_tasks``)."""
    from distributed import get_client, get_worker, secede

    from ..replay import ClusterPlane, UniformSampler
    from ..replay.cluster import decode

    client = get_client()
    secede()
    me = get_worker().address
    cp = ClusterPlane(spec, client=client, name=plane, sampler=UniformSampler(), seed=0)
    drawn = []
    it = cp.batches(batch_size=batch_size, prefetch=2, max_batches=n_batches)
    with it:
        for b in cast("Iterator[Any]", it):   # PrefetchingIterator.__iter__ is typed as the base class
            drawn.append(decode(b.indices)[0])
        summary = it.summary()
    local = next(r.id for r in cp.shards if r.address == me)
    addr = {r.id: r.address for r in cp.shards}
    return {"drawn": [addr[int(s)] for s in __import__("numpy").concatenate(drawn)],
            "me": me, "local": local, "summary": summary}
