"""Find the Dask client to use, or start the embedded ``LocalCluster``.

Every entry point takes ``client=None``. The rule is the same everywhere: an explicit client
wins; else the current default client (``distributed.default_client()``); else an embedded
``LocalCluster`` configured by ``research.cluster.*`` is started for the call and closed after.

The embedded cluster runs with a few of Dask's own settings changed for as long as it lives
(``research.cluster.distributed``): its periodic work shares the cores with the computation
(in-process, with one event loop and the GIL), and at Dask's defaults it took about 6 % of a
core on the 2-core benchmark machine. The profiler samples every 100 ms instead of 10 ms, the
memory monitor reads every 500 ms instead of 100 ms, and the event-loop health tick runs every
100 ms instead of 20 ms; see ``docs/deployment.rst`` for the measurements.

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

__all__ = ["embedded_cluster", "embedded_cluster_kwargs", "embedded_dask_config", "get_client",
           "process_worker_environ", "workers_info"]


def embedded_cluster_kwargs() -> dict:
    """Keyword arguments for the embedded ``LocalCluster`` from ``research.cluster.*``.

    The default is one worker with a thread per core, in this process: NumPy releases the GIL,
    and on the 2-core benchmark machine it reached 0.91-0.94 of two single-process cores
    (four runs) where two one-thread workers reached 0.85-0.92 (each in-process worker adds
    its own heartbeats and monitors to the one event loop) and two worker processes
    0.72-0.83. The process gets the malloc settings of :mod:`dask_research.malloc`.
    Verification then re-runs checked shards on the same worker (recorded as such): inside one
    process a "different worker" is no independent witness anyway; on a real cluster checks
    always go to another worker.
    """
    cores = os.cpu_count() or 1
    processes = bool(config.resolve("cluster.processes"))
    n_workers = config.resolve("cluster.n-workers")
    threads = config.resolve("cluster.threads-per-worker")
    if n_workers is None:
        n_workers = 1 if threads is None else max(1, cores // int(threads))
    if threads is None:
        threads = max(1, cores // int(n_workers))
    return dict(
        n_workers=int(n_workers),
        threads_per_worker=int(threads),
        processes=processes,
        dashboard_address=config.resolve("cluster.dashboard-address", default=None),
    )


def embedded_dask_config() -> dict:
    """``research.cluster.distributed`` as flat ``distributed.*`` keys for ``dask.config.set``.

    Keys may be dotted (``worker.profile.interval``) or nested mappings, with scalar values (a
    Dask setting whose value is itself a mapping, like ``nanny.pre-spawn-environ``, is not
    supported here). ``null`` leaves Dask's settings alone (so does ``{}`` given to
    ``dask.config.set``; in a YAML file Dask merges ``{}`` into the defaults, so use ``null``).

    >>> import dask
    >>> with dask.config.set({"research.cluster.distributed": {"admin": {"tick": {"interval": "1s"}}}}):
    ...     embedded_dask_config()
    {'distributed.admin.tick.interval': '1s'}
    """
    import dask

    from .exceptions import ConfigError

    raw = config.resolve("cluster.distributed", default=None) or {}
    if not isinstance(raw, dict):
        raise ConfigError("cluster.distributed", raw,
                          "a mapping of Dask settings under distributed.*, e.g. {worker.profile.interval: 100ms}")
    out: dict = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(raw, "distributed.")
    import distributed  # noqa: F401  (loads Dask's distributed.* defaults)

    missing = object()
    for key, value in out.items():
        if dask.config.get(key, default=missing) is missing:
            raise ConfigError(f"cluster.{key}", value, f"a setting Dask has; {key} is not one "
                              "(see distributed.yaml in the distributed package)")
    return out


@contextlib.contextmanager
def embedded_cluster() -> Iterator:
    """Start the embedded ``LocalCluster`` of ``research.cluster.*`` and yield its client.

    The cluster and its client are closed on exit; the settings of
    ``research.cluster.distributed`` hold while it lives.
    """
    import dask
    from distributed import Client, LocalCluster

    kwargs = embedded_cluster_kwargs()
    settings = embedded_dask_config()
    spawn: dict[str, str | None] = {}
    if kwargs.get("processes"):
        environ = process_worker_environ()
        settings.update(environ)
        spawn = {k.rsplit(".", 1)[1]: v for k, v in environ.items()}
    else:
        tune_malloc()       # the workers are threads of this process: see dask_research.malloc
    with dask.config.set(settings):
        kwargs["scheduler_kwargs"] = with_research_preloads(
            kwargs.get("scheduler_kwargs"), dashboard=kwargs.get("dashboard_address") is not None)
        # A nanny reads its pre-spawn-environ *under* this process's environment (an os.environ
        # value wins) and leaves what it spawned with in os.environ: after any other
        # process-worker cluster in this process, Dask's MALLOC_TRIM_THRESHOLD_=65536 sat there
        # and silently replaced the embedded cluster's threshold. So the values are in
        # os.environ while the nannies start, and os.environ is as it was afterwards.
        saved = _set_environ(spawn)
        try:
            cluster = LocalCluster(**kwargs)
        finally:
            _set_environ(saved)
        with cluster, Client(cluster) as c:
            yield c


def _set_environ(values: dict[str, str | None]) -> dict[str, str | None]:
    """Set (``None``: remove) ``values`` in ``os.environ``; return what they replaced.

    >>> old = _set_environ({"DASK_RESEARCH_DOCTEST": "1"})
    >>> import os; os.environ["DASK_RESEARCH_DOCTEST"], _set_environ(old)
    ('1', {'DASK_RESEARCH_DOCTEST': '1'})
    >>> "DASK_RESEARCH_DOCTEST" in os.environ
    False
    """
    import os

    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return old


def with_research_preloads(scheduler_kwargs: dict | None, dashboard: bool) -> dict:
    """``scheduler_kwargs`` whose ``preload`` adds this package's scheduler hooks to what the
    user configured (``distributed.scheduler.preload``, read now: an explicit ``preload=``
    replaces the configured one in Dask, so it is carried over here).

    ``dask_research.events`` installs the events handler; ``dask_research.dashboard`` (with a
    dashboard) registers the research pages before the scheduler starts its dashboard, and
    installs the handler too, so this low module needs no import of the pages.

    >>> with_research_preloads({"preload": "mine.py"}, dashboard=True)["preload"]
    ['mine.py', 'dask_research.dashboard']
    >>> with_research_preloads(None, dashboard=False)["preload"]
    ['dask_research.events']
    """
    import dask

    out = dict(scheduler_kwargs or {})
    given = out.get("preload") or dask.config.get("distributed.scheduler.preload", default=None) or []
    preload = [given] if isinstance(given, str) else list(given)
    ours = "dask_research.dashboard" if dashboard else "dask_research.events"
    if ours not in preload:
        preload.append(ours)
    out["preload"] = preload
    return out


def workers_info(client) -> dict:
    """Address -> the scheduler's information on each worker, fetched now (a synchronous client).

    ``client.scheduler_info(n_workers=-1)["workers"]`` reads a cache that the client's own
    periodic refresh (every ``distributed.client.scheduler-info-interval``, without per-worker
    information) can overwrite between the fetch and the read, so it is sometimes empty on a
    cluster with workers. This asks the scheduler and returns its answer itself.
    """
    from ._compat import scheduler_identity

    return dict(scheduler_identity(client)["workers"])


@contextlib.contextmanager
def get_client(client=None) -> Iterator:
    """Yield ``client``, the current default client, or an embedded cluster's client."""
    if client is not None:
        yield client
        return
    from distributed import default_client

    try:
        current = default_client()
    except ValueError:      # no default client: start the embedded cluster
        current = None
    if current is not None:
        yield current       # (not inside the try: a ValueError of the caller's must propagate)
        return
    with embedded_cluster() as c:
        yield c
