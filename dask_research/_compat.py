"""The one place dask-research touches Dask's internals.

Everything else in the package uses Dask's public API. What has no public API is wrapped here,
one named function each, so that a Dask release that moves an internal breaks this file and
``tests/test_compat.py`` loudly (a :class:`DaskCompatError` naming the internal and the installed
``distributed`` version), never a hot path or a guard in silence.

>>> from dask_research import _compat
>>> _compat.in_async_call(None)
False
>>> isinstance(_compat.DISTRIBUTED_VERSION, str)
True
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import distributed

from .exceptions import ResearchError

DISTRIBUTED_VERSION: str = distributed.__version__

__all__ = [
    "DISTRIBUTED_VERSION", "DaskCompatError", "CommClosedError", "FutureCancelledError",
    "FuturesCancelledError", "SCHEDULER_LOST", "client_status", "cancellation_of", "in_async_call", "wait_futures", "scheduler_log_event",
    "scheduler_identity", "scheduler_call", "add_scheduler_handler", "set_scheduler_metadata", "worker_stream_open", "guard_memory_pause", "bandwidth_workers", "total_bandwidth",
    "dashboard_applications", "dashboard_theme", "dashboard_template", "add_periodic_callback",
    "log_errors", "address_host_port", "comm_backend", "heartbeat_interval", "worker_memory_limit",
    "processing_keys", "forget_unsubmitted_jobs", "client_asynchronous", "actor_call",
    "worker_actor", "worker_closing", "scheduler_workers", "actor_released", "dask_worker_command", "run_each",
    "scheduler_plugin", "add_scheduler_plugin", "scheduler_plugins_see_events",
]


class DaskCompatError(ResearchError, RuntimeError):
    """A Dask internal that dask-research relies on is not where this release of Dask has it."""


def _moved(what: str, error: BaseException | None = None) -> DaskCompatError:
    why = f" ({type(error).__name__}: {error})" if error is not None else ""
    return DaskCompatError(
        f"dask-research relies on distributed's {what}, which distributed {DISTRIBUTED_VERSION} "
        f"does not provide{why}; install a distributed release this dask-research supports "
        "(see setup.cfg) or upgrade dask-research")


def _attr(module: str, name: str) -> Any:
    """``module.name``, or a :class:`DaskCompatError` naming both."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise _moved(f"{module}.{name}", e) from None


# ----------------------------------------------------------------------------- exceptions
# distributed raises these but does not export them from its top level.
FutureCancelledError: type[BaseException] = _attr("distributed.client", "FutureCancelledError")
FuturesCancelledError: type[BaseException] = _attr("distributed.client", "FuturesCancelledError")
CommClosedError: type[BaseException] = _attr("distributed.comm.core", "CommClosedError")


# ----------------------------------------------------------------------------- client side

#: The reason Dask gives every future it cancels when the client loses its scheduler.
SCHEDULER_LOST = "scheduler-connection-lost"


def client_status(client: Any) -> str:
    """``client.status``: ``"running"`` while it is connected, ``"connecting"`` while it tries
    to reach a lost scheduler again, then ``"closing"``/``"closed"``; ``"running"`` for a
    stand-in without one (a test's fake client, ``None``).

    >>> client_status(None)
    'running'
    """
    return str(getattr(client, "status", "running"))


def cancellation_of(future: Any) -> BaseException | None:
    """The :class:`FutureCancelledError` that a cancelled ``future`` holds, if it tells one.

    Its ``reason`` says why (``"lost dependencies"``, a lost scheduler, an operator's
    ``client.cancel``); Dask re-reports a future reset while it was gathered as ``"unknown"``.
    Reading it never raises: a future that is not cancelled, or one Dask cannot answer for
    (it has raised ``UnboundLocalError`` from ``utils.sync`` for a future cancelled while read),
    gives ``None``.
    """
    try:
        future.result(timeout=1)
    except FutureCancelledError as e:
        return e
    except Exception:  # noqa: BLE001 - not a cancellation, or Dask could not say
        pass
    return None


def in_async_call(loop: Any) -> bool:
    """Whether the caller runs on ``loop``'s thread inside a coroutine (``distributed.utils``).

    ``None`` (no client loop) is never an async call.
    """
    if loop is None:
        return False
    return bool(_attr("distributed.utils", "in_async_call")(loop))


async def wait_futures(futures: list, timeout: float | None = None,
                       return_when: str = "ALL_COMPLETED") -> Any:
    """Await ``futures`` on the client's loop (``distributed.client._wait``).

    ``distributed.wait`` insists on a default client and blocks; this is its coroutine, for code
    already on the loop. Returns the ``(done, not_done)`` named tuple; raises ``TimeoutError``.
    """
    return await _attr("distributed.client", "_wait")(futures, timeout=timeout,
                                                       return_when=return_when)


async def scheduler_log_event(client: Any, topic: str | list, msg: Any) -> None:
    """Send one event to the scheduler's log from a coroutine on the client's loop.

    :meth:`distributed.Client.log_event` is the public form, but it blocks a synchronous client
    and cannot be awaited from its own loop; this awaits the same scheduler handler.
    """
    await scheduler_call(client, "log_event", topic=topic, msg=msg)


def client_asynchronous(client: Any) -> bool:
    """Whether ``client`` was made with ``asynchronous=True`` (``Client._asynchronous``).

    ``Client.asynchronous`` is public but answers whether the *calling thread* is on the
    client's loop; code that must know how the client was built (to await it, or to call it
    from a thread) reads the flag it was made with.
    """
    if client is None:
        return False
    try:
        return bool(vars(client)["_asynchronous"])
    except (KeyError, TypeError) as e:
        raise _moved("Client._asynchronous (whether the client was made asynchronous)", e) from None


def scheduler_identity(client: Any) -> dict:
    """The scheduler's ``identity`` with every worker (a synchronous client).

    ``client.scheduler_info()`` reads a cache that the client's periodic refresh can overwrite
    without per-worker information; this asks the scheduler and returns its answer.
    """
    try:
        return dict(client.sync(client.scheduler.identity, n_workers=-1))
    except TypeError:   # distributed before n_workers= existed: identity() has every worker
        return dict(client.sync(client.scheduler.identity))


def run_each(client: Any, fn: Callable[..., Any], *args: Any, within: float,
             asked: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """``client.run(fn, *args)`` on each worker the scheduler lists, each answer awaited at most
    ``within`` seconds (a synchronous client): ``({address: result or exception}, {addresses
    still to answer})``.

    One ``client.run`` waits for every worker, so one frozen worker (SIGSTOP, a VM pause) held
    it until the scheduler dropped that worker, minutes later. Here each worker is asked on its
    own; one that has not answered keeps its call in ``asked`` (address -> the call, kept by the
    caller between calls): it is not asked again, nor waited for again, until it answers, and
    its answer is taken by a later call. A worker that left the scheduler is forgotten.
    """
    import asyncio

    workers = set(scheduler_identity(client)["workers"])

    async def ask() -> dict[str, Any]:
        fresh = []
        for address in sorted(workers - set(asked)):
            # Client.run's coroutine (public: asynchronous=True), awaited on the client's loop
            asked[address] = asyncio.ensure_future(client.run(fn, *args, workers=[address],
                                                              on_error="return", asynchronous=True))
            fresh.append(asked[address])
        if fresh:
            await asyncio.wait(fresh, timeout=within)
        answers: dict[str, Any] = {}
        for address, call in list(asked.items()):
            if address not in workers:
                call.cancel()
                del asked[address]
            elif call.done():
                del asked[address]
                try:
                    answers.update(call.result())
                except BaseException as e:  # noqa: BLE001 - the call's own failure, per worker
                    answers[address] = e
        return answers

    answers = client.sync(ask)
    return answers, set(asked) & workers


def cluster_threads(client: Any) -> int | None:
    """Threads of the cluster's workers as the client last heard (``None``: not known yet).

    Reads the identity the client refreshes on its own (``distributed.client.scheduler-info-
    interval``), so asking costs no round trip; ``client.scheduler_info()`` would ask the
    scheduler from a synchronous client, and cannot be called on the client's loop.
    """
    try:
        info = vars(client)["_scheduler_identity"]
    except (KeyError, TypeError) as e:
        raise _moved("Client._scheduler_identity (the cached scheduler identity)", e) from None
    threads = info.get("total_threads") if isinstance(info, dict) else None
    if threads is None and isinstance(info, dict) and info.get("workers"):
        threads = sum(int(w.get("nthreads", 0)) for w in info["workers"].values())
    return None if threads is None else int(threads)


async def scheduler_call(client: Any, op: str, **kwargs: Any) -> Any:
    """Call the scheduler's comm handler ``op`` from a coroutine on the client's loop.

    A scheduler without the handler answers ``None`` (and logs that it has none).
    """
    handler = getattr(client, "scheduler", None)
    if handler is None:
        status = getattr(client, "status", None)
        if status in ("closing", "closed"):     # Client.close() drops its rpc: not a Dask change
            raise RuntimeError(f"the client is {status}")
        raise _moved("Client.scheduler (the scheduler rpc)")
    return await getattr(handler, op)(**kwargs)


def set_scheduler_metadata(scheduler: Any, keys: list[str], value: Any) -> None:
    """Set the scheduler's metadata at ``keys`` from the scheduler's side (what
    ``Client.set_metadata`` does over the wire); clients read it with the ``get_metadata``
    handler, which answers a default instead of failing where nothing was set."""
    setter = getattr(scheduler, "set_metadata", None)
    if not callable(setter):
        raise _moved("Scheduler.set_metadata")
    setter(keys=list(keys), value=value)


def add_scheduler_handler(scheduler: Any, op: str, func: Callable[..., Any]) -> None:
    """Make ``func`` the scheduler's comm handler ``op`` (what extensions do on ``handlers``)."""
    handlers = getattr(scheduler, "handlers", None)
    if not isinstance(handlers, dict):
        raise _moved("Scheduler.handlers (the comm handler table)")
    handlers[op] = func


async def actor_call(client: Any, address: str, key: str, method: str, *args: Any,
                     direct: bool = True) -> Any:
    """Call ``method(*args)`` of the Dask actor ``key`` on the worker at ``address`` from a
    coroutine on the client's loop, as :class:`distributed.Actor` does (the worker's
    ``actor_execute`` handler): straight to the worker over ``client.rpc`` (``direct``), else
    proxied through the scheduler (its ``proxy`` handler). Returns what the method returned,
    raises what it raised; a lost connection raises ``OSError``.

    The public handle (``client.submit(Cls, actor=True).result()``) binds itself to the default
    client, and a call to it whose worker died awaits the actor's future first, which never
    comes back; this calls the same handler for a client and an address of the caller's.
    """
    to_serialize = _attr("distributed.protocol", "to_serialize")
    msg = {"function": method, "actor": key, "args": [to_serialize(a) for a in args], "kwargs": {}}
    pool = getattr(client, "rpc", None)
    if pool is None or not callable(pool):
        raise _moved("Client.rpc (the client's connection pool to workers)")
    if direct:
        result = await pool(address).actor_execute(**msg)
    else:
        result = await scheduler_call(client, "proxy", msg={"op": "actor_execute", **msg},
                                      worker=address)
    if not isinstance(result, dict) or "status" not in result:
        raise _moved("Worker.actor_execute (its reply {'status': ..., 'result': ...})")
    if result["status"] == "OK":
        return result["result"]
    raise result["exception"]


async def scheduler_workers(client: Any) -> dict[str, dict]:
    """``{address: {"nthreads": ..., "status": ...}}`` of the scheduler's workers now, asked
    from a coroutine on the client's loop (the scheduler's ``identity``)."""
    info = await scheduler_call(client, "identity", n_workers=-1)
    workers = info.get("workers") if isinstance(info, dict) else None
    if not isinstance(workers, dict):
        raise _moved("Scheduler.identity()['workers']")
    return {addr: dict(w) for addr, w in workers.items()}


# ----------------------------------------------------------------------------- worker side

def worker_actor(worker: Any, key: Any) -> Any:
    """The actor instance ``key`` that ``worker`` holds (``worker.state.actors``), or ``None``."""
    state = getattr(worker, "state", None)
    actors = getattr(state, "actors", None)
    if not isinstance(actors, dict):
        raise _moved("Worker.state.actors (the worker's actor table)")
    return actors.get(key)


def worker_closing(worker: Any) -> bool:
    """Whether ``worker`` is closing or closed (``worker.status``: Dask's ``Status`` names)."""
    status = getattr(worker, "status", None)
    return getattr(status, "name", str(status)) in ("stopping", "stopped", "closing", "closing_gracefully",
                                                    "closed", "failed")


def worker_stream_open(worker: Any) -> bool:
    """Whether ``worker``'s batched stream to the scheduler is connected (``batched_stream.comm``)."""
    stream = getattr(worker, "batched_stream", None)
    if stream is None:
        return False
    comm = getattr(stream, "comm", None)
    return comm is not None and not comm.closed()


_PAUSE = "_maybe_pause_or_unpause"


def guard_memory_pause(worker: Any, keep_paused: Callable[[Any], bool]) -> Callable[[], None]:
    """Keep ``worker``'s memory monitor from resuming it while ``keep_paused(worker)`` holds.

    ``WorkerMemoryManager._maybe_pause_or_unpause`` resumes any paused worker whose memory is
    fine, every ``distributed.worker.memory.monitor-interval``. This wraps it on ``worker``'s
    instance only and returns the function that restores it. A worker without a memory manager
    (``memory_monitor`` off) needs no guard; a memory manager without the method means Dask moved
    it, and the guard would do nothing: that raises rather than pass in silence.
    """
    mm = getattr(worker, "memory_manager", None)
    if mm is None:
        return lambda: None
    original = getattr(mm, _PAUSE, None)
    if not callable(original):
        raise _moved(f"WorkerMemoryManager.{_PAUSE} (the memory monitor's pause/resume step)")

    def maybe_pause_or_unpause(worker_: Any, memory: int) -> None:
        if keep_paused(worker_):
            return
        original(worker_, memory)

    maybe_pause_or_unpause.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(mm, _PAUSE, maybe_pause_or_unpause)

    def restore() -> None:
        if vars(mm).get(_PAUSE) is maybe_pause_or_unpause:
            delattr(mm, _PAUSE)

    return restore


def worker_memory_limit(worker: Any) -> int | None:
    """``worker``'s memory limit in bytes (``worker.memory_manager.memory_limit``); ``None``: no limit.

    A worker without a memory manager (the memory monitor off) has no limit to report.
    """
    mm = getattr(worker, "memory_manager", None)
    if mm is None:
        return None
    if not hasattr(mm, "memory_limit"):
        raise _moved("WorkerMemoryManager.memory_limit")
    limit = mm.memory_limit
    return int(limit) if limit else None


def actor_released(worker: Any, key: Any) -> bool:
    """Whether ``worker`` no longer holds the actor ``key`` (``worker.state.actors``): its
    future was released, by its client or because that client went away."""
    return worker_actor(worker, key) is None


# ----------------------------------------------------------------------------- scheduler side

def dask_worker_command() -> Any:
    """``dask worker``'s own click command (``distributed.cli.dask_worker.main``), so that
    ``dask-research worker`` checks its arguments exactly as ``dask worker`` will parse them.

    >>> dask_worker_command().make_context("dask worker", ["tcp://127.0.0.1:8786", "--nthreads", "2"]).params["nthreads"]
    2
    """
    return _attr("distributed.cli.dask_worker", "main")


def heartbeat_interval(n_workers: int) -> float:
    """Seconds between two heartbeats of each worker on a cluster of ``n_workers`` (Dask's rule)."""
    return float(_attr("distributed.scheduler", "heartbeat_interval")(int(n_workers)))


def processing_keys(scheduler: Any) -> list:
    """The keys of the tasks ``scheduler`` has handed to a worker and not heard back of
    (``Scheduler.tasks`` whose ``TaskState.state`` is ``"processing"``), read on its loop."""
    tasks = getattr(scheduler, "tasks", None)
    if not isinstance(tasks, dict):
        raise _moved("Scheduler.tasks (the task table)")
    try:
        return [key for key, ts in list(tasks.items()) if ts.state == "processing"]
    except AttributeError as e:
        raise _moved("TaskState.state", e) from None


def forget_unsubmitted_jobs(cluster: Any, submitted: Callable[[Any], bool]) -> int:
    """Drop the job objects of a dask-jobqueue ``cluster`` that were never submitted.

    ``SpecCluster`` expects every worker object it holds to have started; a batch job whose
    submission failed never did, and closing the cluster would wait on it. Each one whose
    ``submitted(job)`` is false is marked failed and removed from ``SpecCluster.workers`` and
    ``.worker_spec``. Returns how many were dropped.
    """
    from distributed import Status

    workers, spec = getattr(cluster, "workers", None), getattr(cluster, "worker_spec", None)
    if not isinstance(workers, dict) or not isinstance(spec, dict):
        raise _moved("SpecCluster.workers / SpecCluster.worker_spec")
    dropped = 0
    for name, job in list(workers.items()):
        if not submitted(job):
            job.status = Status.failed
            workers.pop(name, None)
            spec.pop(name, None)
            dropped += 1
    return dropped


def scheduler_plugin(scheduler: Any, name: str) -> Any | None:
    """The plugin ``scheduler`` runs under ``name`` (``Scheduler.plugins``), or ``None``: none by
    that name, or no plugin table at all (a stand-in for a scheduler, or a Dask that moved it;
    the caller then does without).

    >>> scheduler_plugin(object(), "x") is None
    True
    """
    plugins = getattr(scheduler, "plugins", None)
    if not isinstance(plugins, dict):
        return None
    return plugins.get(name)


def add_scheduler_plugin(scheduler: Any, plugin: Any, name: str) -> None:
    """Run ``plugin`` on ``scheduler`` under ``name`` from the scheduler's side
    (``Scheduler.add_plugin``, what ``Client.register_plugin`` does over the wire); a plugin
    already there under ``name`` is kept."""
    add = getattr(scheduler, "add_plugin", None)
    if not callable(add):
        raise _moved("Scheduler.add_plugin")
    add(plugin, name=name, idempotent=True)


def scheduler_plugins_see_events() -> bool:
    """Whether this Dask calls ``SchedulerPlugin.log_event`` for every event the scheduler logs
    (the hook came with the event broker; an older scheduler never calls it).

    >>> scheduler_plugins_see_events()
    True
    """
    base = _attr("distributed.diagnostics.plugin", "SchedulerPlugin")
    return callable(getattr(base, "log_event", None))


def bandwidth_workers(scheduler: Any) -> dict[tuple[str, str], float]:
    """The scheduler's measured bandwidth per pair of workers (``Scheduler.bandwidth_workers``)."""
    try:
        return dict(scheduler.bandwidth_workers)
    except AttributeError as e:
        raise _moved("Scheduler.bandwidth_workers", e) from None


def total_bandwidth(scheduler: Any) -> float:
    """The scheduler's overall bandwidth estimate in bytes/s (``Scheduler.bandwidth``)."""
    try:
        return float(scheduler.bandwidth)
    except AttributeError as e:
        raise _moved("Scheduler.bandwidth", e) from None


# ----------------------------------------------------------------------------- dashboard (bokeh)

def dashboard_applications() -> dict:
    """The scheduler dashboard's route -> document-function table (needs bokeh)."""
    return _attr("distributed.dashboard.scheduler", "applications")


def dashboard_theme() -> Any:
    """The theme Dask's own dashboard pages use."""
    return _attr("distributed.dashboard.components.scheduler", "BOKEH_THEME")


def dashboard_template(name: str = "simple.html") -> Any:
    """One of the Jinja templates Dask's dashboard pages render into."""
    return _attr("distributed.dashboard.components.scheduler", "env").get_template(name)


def add_periodic_callback(doc: Any, component: Any, interval: int) -> None:
    """Refresh ``component`` every ``interval`` ms while ``doc`` is open (Dask's helper)."""
    _attr("distributed.dashboard.components", "add_periodic_callback")(doc, component, interval)


def log_errors(func: Callable) -> Callable:
    """Dask's decorator that logs, then re-raises, an error of a dashboard callback."""
    return _attr("distributed.utils", "log_errors")(func)


# ----------------------------------------------------------------------------- addresses

def address_host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Dask address such as ``tcp://10.0.0.5:8786``."""
    return _attr("distributed.comm", "get_address_host_port")(address)


def comm_backend(scheme: str) -> Any:
    """Dask's transport for ``scheme`` (``tcp``, ``tls``, ``inproc``...); ``ValueError`` if none."""
    return _attr("distributed.comm.registry", "get_backend")(scheme)
