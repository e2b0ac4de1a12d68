"""Find the Dask client to use, or start the embedded ``LocalCluster``.

Every entry point takes ``client=None``. The rule is the same everywhere: an explicit client
wins; else the current default client (``distributed.default_client()``); else an embedded
``LocalCluster`` configured by ``research.cluster.*`` is started for the call and closed after.

Examples
--------
>>> from dask_research._cluster import get_client
>>> with get_client(None) as client:      # doctest: +SKIP
...     client.submit(sum, [1, 2]).result()
3
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from . import config
from .malloc import process_worker_environ, tune_malloc

__all__ = ["embedded_cluster_kwargs", "get_client", "process_worker_environ"]


def embedded_cluster_kwargs() -> dict:
    """Keyword arguments for the embedded ``LocalCluster`` from ``research.cluster.*``.

    The default is one worker with a thread per core, in this process: NumPy releases the GIL,
    and on the 2-core benchmark machine it reached 0.82-0.87 of two single-process cores
    (median of three runs) where two one-thread workers reached 0.74-0.76 (each in-process
    worker adds its own heartbeats and monitors to the one event loop). The process gets the
    malloc settings of :mod:`dask_research.malloc`. Verification then re-runs checked shards on the same
    worker (recorded as such): inside one process a "different worker" is no independent
    witness anyway; on a real cluster checks always go to another worker.
    """
    cores = os.cpu_count() or 1
    processes = bool(config.get("cluster.processes"))
    n_workers = config.get("cluster.n-workers")
    threads = config.get("cluster.threads-per-worker")
    if n_workers is None:
        n_workers = 1 if threads is None else max(1, cores // int(threads))
    if threads is None:
        threads = max(1, cores // int(n_workers))
    return dict(
        n_workers=int(n_workers),
        threads_per_worker=int(threads),
        processes=processes,
        dashboard_address=config.get("cluster.dashboard-address", default=None),
    )


@contextlib.contextmanager
def get_client(client=None) -> Iterator:
    """Yield ``client``, the current default client, or an embedded cluster's client."""
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster, default_client

    try:
        yield default_client()
        return
    except ValueError:
        pass
    kwargs = embedded_cluster_kwargs()
    if kwargs.get("processes"):
        import dask

        with dask.config.set(process_worker_environ()):
            with LocalCluster(**kwargs) as cluster, Client(cluster) as c:
                yield c
        return
    tune_malloc()       # the workers are threads of this process: see dask_research.malloc
    if kwargs.get("dashboard_address") is not None:
        try:  # the research pages are part of the embedded dashboard (needs bokeh)
            import dask_research.dashboard  # noqa: F401
        except ImportError:
            pass
    with LocalCluster(**kwargs) as cluster, Client(cluster) as c:
        yield c
