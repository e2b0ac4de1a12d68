"""A Dask client whose workers live in this process: the cluster plane's collaborators
(:class:`~dask_research.replay.cluster.ShardTable`, delivery, the router) driven without a
cluster, each worker holding a real :class:`~dask_research.replay.cluster.WorkerShard`.

It answers the client calls they make (``run``, ``submit``, ``sync``, ``run_on_scheduler``,
``log_event`` and the scheduler identity that :mod:`dask_research._compat` asks for); a worker
that left answers no ``run`` and never finishes a task.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import UniformSampler
>>> from dask_research.replay.cluster import WorkerShard
>>> client = FakeClient()
>>> shard = client.add("tcp://w:1", WorkerShard("p", {"x": ((), "int64")}, 10, UniformSampler(), seed=0))
>>> shard.ingest({"x": np.arange(3)})
3
>>> client.run(lambda dask_worker: len(dask_worker.plugins), workers=["tcp://w:1"]), client.runs
({'tcp://w:1': 1}, 1)
>>> client.close()
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeClient", "FakeFuture"]


class FakeFuture:
    """A Dask future's surface as delivery and the router use it.

    >>> FakeFuture(3).result(), FakeFuture(status="pending").done()
    (3, False)
    """

    def __init__(self, value: Any = None, status: str = "finished", exc: BaseException | None = None):
        self.value, self.status, self.exc = value, status, exc
        self.cancelled = self.released = False

    def done(self) -> bool:
        return self.status != "pending"

    def result(self, timeout: float | None = None) -> Any:
        if self.status == "finished":
            return self.value
        raise self.exc or RuntimeError(self.status)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self.exc

    def cancel(self) -> None:
        self.cancelled, self.status = True, "cancelled"

    def release(self) -> None:
        self.released = True


class FakeClient:
    """Workers in this process by address, each with the shard of plane ``name`` as its plugin.

    ``bandwidth`` is what ``run_on_scheduler`` answers (the scheduler's bandwidth table);
    ``events`` records ``log_event``; ``runs`` counts ``run`` calls.
    """

    def __init__(self, name: str = "p", bandwidth: dict | None = None):
        self.name = name
        self.workers: dict[str, SimpleNamespace] = {}
        self.events: list[tuple[str, Any]] = []
        self.bw = bandwidth if bandwidth is not None else {"total": 5e8, "workers": {}}
        self.runs = 0

    def add(self, address: str, shard: Any) -> Any:
        """A worker at ``address`` holding ``shard``; returns the shard."""
        from ..replay.cluster import plugin_name

        self.workers[address] = SimpleNamespace(address=address, plugins={plugin_name(self.name): SimpleNamespace(shard=shard)})
        return shard

    def stop(self, address: str) -> None:
        """The worker at ``address`` leaves (its shard is closed)."""
        from ..replay.cluster import plugin_name

        self.workers.pop(address).plugins[plugin_name(self.name)].shard.close()

    def run(self, fn, *args, workers=None, on_error="raise", asynchronous=False):
        self.runs += 1
        out = {a: fn(*args, dask_worker=w) for a, w in self.workers.items() if workers is None or a in workers}
        if not asynchronous:
            return out

        async def answer():            # the refresh asks each worker on its own (_compat.run_each)
            return out
        return answer()

    @property
    def scheduler(self) -> SimpleNamespace:   # what dask_research._compat.scheduler_identity asks
        return SimpleNamespace(identity=lambda n_workers=-1: {"workers": dict.fromkeys(self.workers, {})})

    def sync(self, fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out

    def run_on_scheduler(self, fn) -> dict:
        return self.bw

    def submit(self, fn, *args, workers, **kw) -> FakeFuture:
        w = self.workers.get(workers[0])
        if w is None:
            return FakeFuture(status="pending")
        try:
            return FakeFuture(fn(*args, dask_worker=w))
        except Exception as e:
            return FakeFuture(status="error", exc=e)

    def log_event(self, topic: str, msg: Any) -> None:
        self.events.append((topic, msg))

    def close(self) -> None:
        for a in list(self.workers):
            self.stop(a)
