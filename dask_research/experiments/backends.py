"""Where experiments run: asyncio tasks in this process, or Dask futures on a cluster.

Both backends offer the same small surface to the driver (:mod:`.loop`):

- ``submit(hypothesis, queued=False, slot=None) -> token``: start one experiment (``queued``:
  it is decided ahead and waits behind a running one, see :mod:`.ahead`; ``slot``: the slot it
  is for, which :class:`~.actors.ActorBackend` keeps and the others need not);
- ``queues_in_cluster`` and ``can_queue(slots)``: whether a queued experiment waits in the
  cluster (Dask) or in the driver (local), and whether queueing ahead is possible now;
- ``await wait(timeout) -> [(token, Result | BaseException), ...]``: everything that has
  finished, blocking until at least one has (or ``timeout`` passes);
- ``side(fn, *args) -> awaitable``: run a side job (the paper writer) in parallel;
- ``ship(records)``: forward event records to the Dask event log (a no-op locally);
- ``await cancel(token)``: give one experiment up (timeouts and the run's deadline, see
  :mod:`.timeouts`);
- ``await release()``: nothing more will be submitted; give back what the slots hold (the
  actors' threads, for the paper writers the run still waits for; nothing elsewhere);
- ``await close()``.

:class:`LocalBackend` runs ``async def`` runners as tasks on the running loop and sync runners
in a pool of daemon threads, one per slot, in which a stuck call can be abandoned; it waits with
``asyncio.wait(..., return_when=FIRST_COMPLETED)``. Its optional ``on_finish(token, result)``
hook runs in the finished task's last step, so the driver can book a result and refill the
slot without the two event-loop hops of waking the waiter (``wait`` still reports the task). :class:`DaskBackend` submits
``client.submit`` futures and watches them with ``distributed.as_completed``; it must run on
the client's event loop (the driver arranges that for sync and asynchronous clients); it is
``transport="tasks"``. :class:`~.actors.ActorBackend` (``transport="actors"``, the default)
offers the same surface with one long-lived Dask actor per slot, called on its worker.

Examples
--------
Two experiments with a sync runner, on this process's loop, the way the driver uses a backend:

>>> import asyncio
>>> from dask_research.experiments import Hypothesis
>>> async def two():
...     backend = LocalBackend(lambda h: 0.25 if h.branch == "a" else 0.75, slots=2, bounded=True)
...     for h in (Hypothesis("a-1", "a"), Hypothesis("b-1", "b")):
...         backend.submit(h)
...     rewards = []
...     while len(rewards) < 2:
...         rewards += [result.reward for _, result in await backend.wait(timeout=60)]
...     await backend.close()
...     return sorted(rewards)
>>> asyncio.run(two())
[0.25, 0.75]
"""
from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .._compat import client_status, cluster_threads
from ..events import Outbox
from ..events import topic as event_topic
from .execute import _run_coroutine, execute_async, execute_sync, is_async_callable
from .timeouts import AbandonablePool
from .types import Hypothesis, Result

__all__ = ["LocalBackend", "DaskBackend", "ClusterCancelled"]

Outcome = tuple[Any, "Result | BaseException"]


class ClusterCancelled(RuntimeError):
    """The outcome of an experiment whose Dask future was cancelled on the cluster, not by the
    run (a lost scheduler, ``client.cancel``, ``client.restart``): the experiment did not fail,
    so the driver does not count it (see :class:`~.driver.LoopDriver`)."""

    def __init__(self, key: Any, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"its Dask future {key!r} was cancelled on the cluster ({reason})")


async def _call_side_async(fn: Callable[..., Any], args: tuple) -> Any:
    if is_async_callable(fn):
        return await fn(*args)
    # a daemon thread of its own (not asyncio.to_thread: the default executor is joined when
    # the loop closes, so a paper writer that hangs would hang the run's return)
    pool = AbandonablePool(1, "paper")
    cfut = pool.submit(fn, *args)
    pool.shutdown()                     # the thread exits after this one call
    try:
        out = await asyncio.wrap_future(cfut)
    except asyncio.CancelledError:
        pool.abandon(cfut)
        raise
    if asyncio.iscoroutine(out):
        out = await out
    return out


class PickledRunner:
    """A runner pickled once on the client, and unpickled once per worker process.

    Pickling this object copies bytes (no cloudpickle walk of the closure), wherever it
    happens: on the client for every dispatch, and on the scheduler, which unpacks each task
    and packs it again for the worker. The worker unpickles the runner on the first call and
    keeps the last few by digest.
    """

    def __init__(self, runner: Callable[[Hypothesis], Any] | None = None, *,
                 digest: str = "", blob: bytes = b""):
        if runner is not None:
            import hashlib

            import cloudpickle

            blob = cloudpickle.dumps(runner)
            digest = hashlib.sha256(blob).hexdigest()
        self.digest, self.blob = digest, blob

    def __reduce__(self) -> tuple:
        return _pickled_runner, (self.digest, self.blob)

    def load(self) -> Callable[[Hypothesis], Any]:
        runner = _loaded.get(self.digest)
        if runner is None:
            import pickle

            runner = pickle.loads(self.blob)
            while len(_loaded) >= 8:                  # a few runs' runners, not every run's
                _loaded.pop(next(iter(_loaded)))
            _loaded[self.digest] = runner
        return runner

    def __call__(self, h: Hypothesis) -> Any:
        return self.load()(h)


_loaded: dict[str, Callable[[Hypothesis], Any]] = {}


def _pickled_runner(digest: str, blob: bytes) -> PickledRunner:
    return PickledRunner(digest=digest, blob=blob)


def _call_side_sync(fn: Callable[..., Any], args: tuple) -> Any:
    out = fn(*args)
    if asyncio.iscoroutine(out):
        out = _run_coroutine(out)       # the worker thread's loop, as for runners
    return out


def execute_noticed(runner: Callable[[Hypothesis], Any], h: Hypothesis, bounded: bool,
                    objectives: tuple[str, ...] | None, notice: tuple[str, str]) -> Result:
    """:func:`~.execute.execute_sync` that first says, on the scheduler's event log under
    ``notice = (topic, run)``, that it started (a ``start`` event with the task's key): the
    driver counts a queued experiment's timeout from then. Best effort: the event travels on
    the worker's own batched stream and never fails the experiment."""
    try:
        from distributed import get_worker

        worker = get_worker()
        Outbox(worker, "experiments", run=notice[1], topic=notice[0]).emit(
            "start", hypothesis=h.id, key=worker.get_current_task())
    except Exception:  # noqa: BLE001 - the notice is informational for the driver's clock
        pass
    return execute_sync(runner, h, bounded, objectives)


class _StartNotices:
    """One subscription per client to the ``start`` events of queued experiments, handed to
    the backend of their run (several runs may share a client; ``Client.subscribe_topic``
    keeps one handler per topic)."""

    def __init__(self, client: Any, topic: str) -> None:
        self.client, self.topic = client, topic
        self.runs: dict[str, Callable[[str], None]] = {}
        client.subscribe_topic(topic, self._event)

    def _event(self, event: tuple[float, Any]) -> None:
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else None
        if isinstance(msg, dict):
            hook = self.runs.get(str(msg.get("run")))
            if hook is not None and msg.get("key") is not None:
                hook(str(msg["key"]))

    def add(self, run: str, hook: Callable[[str], None]) -> None:
        self.runs[run] = hook

    def remove(self, run: str) -> None:
        self.runs.pop(run, None)
        if not self.runs:
            _NOTICES.pop(self.client, None)
            try:
                self.client.unsubscribe_topic(self.topic)
            except Exception:  # noqa: BLE001 - a closing client
                pass


_NOTICES: weakref.WeakKeyDictionary[Any, _StartNotices] = weakref.WeakKeyDictionary()


class LocalBackend:
    """Experiments as asyncio tasks (sync runners in a pool of ``slots`` threads).

    A queued experiment waits in the driver (:mod:`.ahead`): a slot is refilled inside the
    finished task, so there is no round trip to hide, and ``"auto"`` never queues here.
    """

    queues_in_cluster = False
    notify_starts = False

    def __init__(self, runner: Callable[[Hypothesis], Any], slots: int, bounded: bool,
                 objectives: tuple[str, ...] | None = None):
        self.runner = runner
        self.bounded = bounded
        self.objectives = objectives
        self._is_async = is_async_callable(runner)
        self._executor = None if self._is_async else AbandonablePool(slots, "experiment")
        self._tasks: set[asyncio.Task] = set()
        self.on_finish: Callable[[asyncio.Task, Result], None] | None = None

    def can_queue(self, slots: int) -> bool:
        return True

    def poke(self) -> None:
        """Nothing to wake: a local slot starts its queued experiment in the finished task."""

    def submit(self, h: Hypothesis, queued: bool = False, slot: int | None = None) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._run(h))
        self._tasks.add(task)
        return task

    async def _run(self, h: Hypothesis) -> Result:
        out = await execute_async(self.runner, h, self.bounded, self._executor, self._is_async,
                                  self.objectives)
        hook, task = self.on_finish, asyncio.current_task()
        if hook is not None and task is not None:   # the driver books the result and refills
            hook(task, out)           # the slot here, in this task's last step: no wake-up hops
        return out

    async def wait(self, timeout: float | None) -> list[Outcome]:
        done, _ = await asyncio.wait(self._tasks, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        out: list[Outcome] = []
        for task in done:
            self._tasks.discard(task)
            if task.cancelled():    # not by cancel() (it forgets its token first): the runner
                out.append((task, RuntimeError(     # raised CancelledError; its slot is not lost
                    "the experiment was cancelled from inside its runner (asyncio.CancelledError)")))
            else:
                out.append((task, task.exception() or task.result()))
        return out

    async def cancel(self, token: asyncio.Task) -> None:
        """Give up one experiment: its task is cancelled (a sync runner's thread abandoned)."""
        self._tasks.discard(token)
        token.cancel()

    def side(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return asyncio.ensure_future(_call_side_async(fn, args))

    def ship(self, records: list[dict]) -> None:
        pass

    async def release(self) -> None:
        """Nothing to give back: the slots hold nothing between experiments."""

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._executor is not None:
            self._executor.shutdown()


class ClusterSideJobs:
    """What the two cluster backends (:class:`DaskBackend`, :class:`~.actors.ActorBackend`)
    share: a side job (the paper writer) is a Dask task, and event records go to the
    scheduler's event log through the backend's batched ``_outbox``."""

    client: Any
    _outbox: Outbox

    def side(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        fut = self.client.submit(_call_side_sync, fn, args, pure=False,
                                 key=f"paper-{uuid.uuid4().hex[:12]}")

        async def watch() -> Any:
            return await fut

        return asyncio.ensure_future(watch())

    def ship(self, records: list[dict]) -> None:
        for record in records:
            self._outbox.put(record)

    async def _drain(self) -> None:
        """Wait until the events shipped so far reach the scheduler, unless the client lost it
        (its status is not ``"running"``): a shipment then only fails, once the connect timeout
        has passed (``distributed.comm.timeouts.connect``, 30 s by default), and the run's
        one-line error waited for that. The shipper still ends on its own (logged once)."""
        if client_status(self.client) != "running":
            return
        await self._outbox.drain()      # best effort: a failed shipment is logged, not raised


class DaskBackend(ClusterSideJobs):
    """Experiments as Dask futures watched by ``distributed.as_completed``.

    Runs on the client's event loop. Event records go to the scheduler's event log under
    ``topic`` through a batched :class:`dask_research.events.Outbox`: one shipment in flight
    at a time, each a :func:`dask_research.events.batch` envelope ``{"v": 1, "source":
    "experiments", "event": "batch", "run": run_id, "time": ..., "events": [record, ...]}``;
    each record is shaped like the other capabilities' events (``{"event": kind, "run":
    run_id, ...}``).

    A queued experiment (:mod:`.ahead`) is submitted at once and waits in the cluster, so it
    starts the moment a thread frees (``fifo_timeout=0``: experiments start in the order they
    were decided; Dask's default ranks tasks submitted within 100 ms of each other by key); that keeps at most ``slots`` experiments running only
    while the cluster has no more threads than slots, which :meth:`can_queue` checks (from the
    identity the client refreshes on its own). With a ``timeout`` a queued experiment says
    when it starts (:func:`execute_noticed`); ``on_start(token)`` hears it.
    """

    queues_in_cluster = True

    def __init__(self, client: Any, runner: Callable[[Hypothesis], Any], bounded: bool,
                 topic: str | None, run_id: str, objectives: tuple[str, ...] | None = None,
                 notify_starts: bool = False):
        from distributed import as_completed

        self.client = client
        self.runner = runner
        self.bounded = bounded
        self.objectives = objectives
        self.topic = topic
        self.run_id = run_id
        self._ac = as_completed([], loop=client.loop, with_results=True, raise_errors=False)
        self._next: asyncio.Future | None = None
        self._outbox = Outbox(client if topic else None, "experiments", run=run_id,
                              batched=True, topic=topic)
        self._futures: set[Any] = set()
        # the runner is pickled once per run (a closure over a model or a table used to be
        # pickled again for every dispatch); each task carries the bytes, and a worker
        # unpickles them once. Not a dependency task: Dask would then send every experiment
        # to the worker that holds it.
        self._runner: PickledRunner | None = None
        self.on_start: Callable[[Any], None] | None = None
        self._notice: tuple[str, str] | None = None
        self._keys: dict[str, Any] = {}           # key -> future of queued experiments (notices)
        self._wake: asyncio.Future | None = None
        if notify_starts:
            self._notice = (f"{event_topic('experiments')}.started", run_id)

    @property
    def notify_starts(self) -> bool:
        """Whether queued experiments report their start (with a timeout)."""
        return self._notice is not None

    def poke(self) -> None:
        """Wake :meth:`wait` (a new deadline to honour)."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def can_queue(self, slots: int) -> bool:
        """Whether an experiment submitted now would wait for a running one to end (the
        cluster has at most ``slots`` threads) rather than start on a spare thread."""
        threads = cluster_threads(self.client)
        return threads is not None and 0 < threads <= slots

    def submit(self, h: Hypothesis, queued: bool = False, slot: int | None = None) -> Any:
        if self._runner is None:
            self._runner = PickledRunner(self.runner)
        # one task group and prefix, "experiment", for every experiment: with the id first, an
        # id such as "hang" made a group of its own, so Dask queued some experiments on the
        # scheduler and sent others to a worker at once, out of the order they were decided
        key = f"experiment-{uuid.uuid4().hex[:8]}-{h.id}"
        if queued and self._notice is not None:
            self._subscribe()
            fut = self.client.submit(execute_noticed, self._runner, h, self.bounded,
                                     self.objectives, self._notice, pure=False, key=key,
                                     fifo_timeout=0)
            self._keys[key] = fut
        else:
            fut = self.client.submit(execute_sync, self._runner, h, self.bounded,
                                     self.objectives, pure=False, key=key, fifo_timeout=0)
        self._futures.add(fut)
        self._ac.add(fut)
        return fut

    def _subscribe(self) -> None:
        assert self._notice is not None
        hub = _NOTICES.get(self.client)
        if hub is None:
            hub = _NOTICES[self.client] = _StartNotices(self.client, self._notice[0])
        if self._notice[1] not in hub.runs:
            hub.add(self._notice[1], self._started)

    def _started(self, key: str) -> None:
        fut = self._keys.pop(key, None)
        if fut is not None and self.on_start is not None:
            self.on_start(fut)

    def _unpack(self, item: tuple) -> Outcome:
        fut, value = item
        ours = fut in self._futures           # not yet given up by cancel() or close()
        self._futures.discard(fut)
        self._keys.pop(fut.key, None)
        if fut.status == "cancelled" and ours:
            # cancelled on the cluster, not by this run: the client lost its scheduler, or
            # someone cancelled it (client.cancel, client.restart). The experiment did not fail
            reason = getattr(value, "reason", None) or getattr(value, "msg", None) or "unknown"
            return fut, ClusterCancelled(fut.key, str(reason).split("\n")[0])
        if fut.status == "error":
            exc = value[1] if isinstance(value, tuple) and len(value) == 3 else value
            if not isinstance(exc, BaseException):
                exc = RuntimeError(repr(exc))
            return fut, exc
        if fut.status == "cancelled" or isinstance(value, BaseException):
            return fut, value if isinstance(value, BaseException) else RuntimeError("cancelled")
        return fut, value

    async def wait(self, timeout: float | None) -> list[Outcome]:
        if self._next is None:
            self._next = asyncio.ensure_future(self._ac.__anext__())
        self._wake = wake = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({self._next, wake}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._wake = None
            wake.cancel()
        if not self._next.done():
            return []
        first, self._next = self._next.result(), None
        out = [self._unpack(first)]
        while self._ac.has_ready():
            out.append(self._unpack(await self._ac.__anext__()))
        return out

    async def cancel(self, token: Any) -> None:
        """Cancel one experiment's future on the cluster (``Client.cancel``)."""
        self._futures.discard(token)
        self._keys.pop(token.key, None)
        try:
            await self.client.cancel([token], asynchronous=True,
                                     reason="dask-research: experiment timeout or run deadline")
        except Exception:  # noqa: BLE001 - a lost scheduler: the future is released anyway
            pass

    async def release(self) -> None:
        """Nothing to give back: a task holds its thread only while it runs."""

    async def close(self) -> None:
        if self._next is not None and not self._next.done():
            self._next.cancel()
        if self._notice is not None:
            hub = _NOTICES.get(self.client)
            if hub is not None:
                hub.remove(self._notice[1])
        self._keys.clear()
        left, self._futures = list(self._futures), set()
        if left:                    # a run that failed: what it queued must not start (dropping
            try:                    # the futures does not release them: as_completed holds them)
                await self.client.cancel(left, asynchronous=True, reason="dask-research: the run ended")
            except Exception:  # noqa: BLE001 - a lost scheduler: released with the client
                pass
        await self._drain()
