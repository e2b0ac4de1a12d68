"""The one event layer: an envelope, topics from config, an outbox, a reader.

Every subsystem says what happens on the scheduler's event log (``client.get_events(topic)``,
``client.subscribe_topic(topic, handler)``), so the dashboard pages and any subscriber see the
work of every client on that scheduler. This module is the vocabulary they share:

- :func:`topic`: the topic of a subsystem, ``research.<subsystem>.event-topic`` (montecarlo,
  experiments, replay, power, cluster);
- :func:`envelope`: one event, ``{"v": 1, "source": ..., "event": kind, "run": ..., "time":
  ..., **fields}``; a shipment of several events in one log entry is itself an envelope of kind
  ``batch`` whose ``events`` field holds them;
- :class:`Outbox`: the one transport of every producer: ordered, batched, bounded and never
  raising. From a client: many events per scheduler round trip, one shipment in flight at a
  time, from the client's loop or any thread. From a worker (a power policy, a worker set-up
  step): each event goes on the worker's own batched stream;
- :func:`unpack`: the reader's side, one ``(time, event)`` per event whether it was logged
  alone or inside a ``batch``, and whatever shape older producers used.

Events carry indices, names, addresses and numbers, never inputs, payloads or credentials.
See docs/events.rst for the kinds of each subsystem.

Examples
--------
>>> from dask_research import events
>>> events.topic("power")
'research.power'
>>> msg = events.envelope("montecarlo", "accepted", "run-1", time=0.0, start=0, stop=4)
>>> msg
{'v': 1, 'source': 'montecarlo', 'event': 'accepted', 'run': 'run-1', 'time': 0.0, 'start': 0, 'stop': 4}
>>> [m["event"] for _, m in events.unpack([(1.0, msg), (2.0, events.batch("experiments", "r", [
...     {"event": "select", "run": "r"}, {"event": "dispatch", "run": "r"}]))])]
['accepted', 'select', 'dispatch']
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time as _time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from . import config
from ._compat import add_scheduler_handler, scheduler_call, scheduler_log_event, set_scheduler_metadata

logger = logging.getLogger(__name__)

__all__ = ["VERSION", "SUBSYSTEMS", "topic", "envelope", "batch", "unpack", "Outbox", "pack", "unpack_shipment"]

#: Version of the envelope; a reader that meets a higher one reads the fields it knows.
VERSION = 1

#: The subsystems that log events, each with its ``research.<subsystem>.event-topic``.
SUBSYSTEMS = ("montecarlo", "experiments", "replay", "power", "cluster")

#: Keys every envelope carries; an event's own fields may not use them.
RESERVED = ("v", "source", "event", "run", "time")


def topic(subsystem: str) -> str:
    """The event-log topic of ``subsystem``, read from ``research.<subsystem>.event-topic``.

    >>> topic("montecarlo")
    'research.montecarlo'
    """
    return str(config.resolve(f"{subsystem}.event-topic"))


def envelope(source: str, kind: str, run: str | None = None, *, time: float | None = None,
             **fields: Any) -> dict[str, Any]:
    """One event: version, source subsystem, kind, run id (or None), wall time, its fields.

    ``time`` defaults to now (``time.time()``, where the event happened, not when it reached
    the log). The reserved keys (:data:`RESERVED`) cannot be fields.

    >>> envelope("power", "pause", time=5.0, worker="tcp://w:1")["worker"]
    'tcp://w:1'
    >>> envelope("power", "pause", v=2)
    Traceback (most recent call last):
    ...
    ValueError: event field 'v' is reserved by the envelope
    """
    for key in RESERVED:
        if key in fields:
            raise ValueError(f"event field {key!r} is reserved by the envelope")
    return {"v": VERSION, "source": source, "event": kind, "run": run,
            "time": _time.time() if time is None else time, **fields}


def batch(source: str, run: str | None, events: list[dict]) -> dict[str, Any]:
    """Several events in one log entry: an envelope of kind ``batch`` holding them in order.

    >>> batch("experiments", "r", [{"event": "add", "run": "r"}])["events"]
    [{'event': 'add', 'run': 'r'}]
    """
    return envelope(source, "batch", run, events=list(events))


def unpack(log: Iterable[tuple[float, Any]]) -> Iterator[tuple[float, dict]]:
    """``(log time, event)`` for every event of a topic's log, batches opened, in order.

    Reads what producers log today and logged before the envelope (a dict with ``event``, or
    ``action`` for power transitions); entries that are not dicts, and a batch whose
    ``events`` is not a list (any client can log anything), are skipped.

    >>> list(unpack([(1.0, "noise"), (2.0, {"action": "pause"}), (3.0, {"event": "batch", "events": 5})]))
    [(2.0, {'action': 'pause'})]
    """
    for t, msg in log:
        if not isinstance(msg, dict):
            continue
        if msg.get("event") == "batch":
            inner = msg.get("events")
            # a list as logged; a tuple once it crossed a Dask comm (msgpack arrays)
            evs: Iterable[Any] = inner if isinstance(inner, (list, tuple)) else ()
        else:
            evs = (msg,)
        for ev in evs:
            if isinstance(ev, dict):
                yield t, ev


#: The scheduler comm handler that logs a shipment of events one log entry each, in order:
#: installed by :func:`dask_setup` (``dask scheduler --preload dask_research.events``; the
#: ``dask_research.dashboard`` preload and the embedded cluster install it too).
HANDLER = "research_log_events"

#: Where :func:`install` says so in the scheduler's metadata (``Client.get_metadata``): a
#: client asks there, which answers a default where nothing was installed, instead of calling
#: a handler the scheduler may not have (which logs a warning with a traceback there).
METADATA = ["dask_research", "events"]


def _plain(obj: Any) -> Any:
    """What msgpack cannot pack itself: NumPy scalars and arrays as Python values."""
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    raise TypeError(f"cannot pack {type(obj).__name__}")


def pack(msgs: list[dict]) -> bytes | None:
    """A shipment as one msgpack blob, or None when an event holds something msgpack cannot.

    The blob travels as bytes, so Dask's comm neither walks the events to size the message
    (``sizeof`` recursing through every field cost more client CPU than the round trip) nor
    encodes them again; the handler unpacks it on the scheduler.

    >>> import numpy as np
    >>> unpack_shipment(pack([{"event": "accepted", "mean": np.float64(0.5)}]))
    [{'event': 'accepted', 'mean': 0.5}]
    >>> pack([{"f": object()}]) is None
    True
    """
    try:
        return msgpack.packb(msgs, default=_plain, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return None


def unpack_shipment(packed: bytes) -> list:
    """The events of a :func:`pack` blob (the scheduler's side); a list, or ValueError."""
    msgs = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    if not isinstance(msgs, list):
        raise ValueError(f"a packed shipment is a list of events, not {type(msgs).__name__}")
    return msgs


def install(scheduler: Any) -> None:
    """Install :data:`HANDLER` on ``scheduler``: one round trip logs many events.

    >>> class Scheduler:
    ...     handlers, log, meta = {}, [], None
    ...     def log_event(self, topic, msg):
    ...         self.log.append((topic, msg))
    ...     def set_metadata(self, keys, value):
    ...         self.meta = value
    >>> s = Scheduler(); install(s)
    >>> s.handlers[HANDLER](topic="t", msgs=[{"a": 1}, {"a": 2}]), s.log
    (2, [('t', {'a': 1}), ('t', {'a': 2})])
    >>> s.handlers[HANDLER](topic="t", packed=pack([{"a": 3}])), s.log[-1]
    (1, ('t', {'a': 3}))
    >>> s.meta
    {'handler': 'research_log_events', 'packed': True}
    """
    def log_events(topic: str, msgs: list | None = None, packed: bytes | None = None) -> int:
        if packed is not None:
            msgs = unpack_shipment(packed)
        if not isinstance(msgs, list):
            raise ValueError("a shipment of events is a list")
        for msg in msgs:
            scheduler.log_event(topic, msg)
        return len(msgs)

    add_scheduler_handler(scheduler, HANDLER, log_events)
    set_scheduler_metadata(scheduler, METADATA, {"handler": HANDLER, "packed": True})


def dask_setup(scheduler: Any) -> None:
    """Dask preload hook (``--preload dask_research.events``): :func:`install`."""
    install(scheduler)


#: Per scheduler address: whether it has :data:`HANDLER` (its metadata says so). One without
#: it (not preloaded with this package) gets one ``log_event`` per event.
_FANOUT: dict[str, bool] = {}

#: Per scheduler address: whether its handler takes :func:`pack` blobs.
_PACKED: dict[str, bool] = {}


def _is_worker(target: Any) -> bool:
    from distributed import Worker

    return isinstance(target, Worker)


class Outbox:
    """Ordered, batched, bounded, best-effort shipment of one producer's events to the scheduler's log.

    ``target`` is a :class:`distributed.Client` (or ``None``: every event is dropped), or a
    :class:`distributed.Worker` (or, with ``worker=True``, anything with the worker's
    ``log_event``), whose events go on the worker's own batched stream to the scheduler
    (``Worker.log_event``) as they are put. :meth:`emit` (or :meth:`put` for a ready
    message) queues and returns at once, from the client's event loop or any other thread.
    At most :attr:`MAX_QUEUED` events wait (a scheduler that stops answering cannot make a
    producer's memory grow): past that the oldest waiting event is dropped, counted in
    :attr:`dropped`, and logged once. One coroutine on the client's loop ships what is
    queued, one shipment in flight at a time, so events arrive in the order they were emitted;
    whatever queues while a shipment is in flight goes in the next one, and the shipper waits
    up to ``linger`` seconds (:attr:`LINGER`) for more before each shipment, unless a flush
    is waiting. A shipment is one scheduler round trip however many events it carries:

    - ``batched=False`` (default): every event is its own log entry, as subscribers of
      ``research.montecarlo`` read them; a scheduler with :data:`HANDLER` logs a whole
      shipment in one call (the events packed as one msgpack blob, :func:`pack`); one without
      it gets one ``log_event`` per event. Which it is, the scheduler's metadata says
      (:data:`METADATA`, read once per scheduler), so a scheduler without the handler is never
      asked for it;
    - ``batched=True``: a shipment is one :func:`batch` entry (``research.experiments``).

    :meth:`flush` (a thread) or :meth:`drain` (a coroutine on the loop) waits until everything
    queued is sent. A failed send costs the events (counted in :attr:`failed`, logged, kept in
    :attr:`last_error`), never the caller. ``client=None`` drops every event.

    Examples
    --------
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster) as client:
    ...     box = Outbox(client, "montecarlo", topic="doc-example")
    ...     box.emit("start", "run-1", shards=4)
    ...     box.emit("done", "run-1")
    ...     box.flush(), [m["event"] for _, m in client.get_events("doc-example")]
    (True, ['start', 'done'])
    """

    #: Seconds the shipper waits for more events before a shipment (a flush cuts it short):
    #: events are for people and pages, which refresh every half second.
    LINGER = 0.02
    #: Most events waiting to be shipped (beyond: the oldest is dropped).
    MAX_QUEUED = 100_000

    def __init__(self, target: Any, source: str, *, run: str | None = None,
                 batched: bool = False, topic: str | None = None,
                 linger: float | None = None, worker: bool | None = None) -> None:
        on_worker = _is_worker(target) if worker is None else worker
        self.worker: Any = target if on_worker and target is not None else None
        self.client: Any = None if self.worker is not None else target
        self.source, self.run, self.batched = source, run, batched
        self._topic = topic
        self.linger = self.LINGER if linger is None else float(linger)
        self._hurry: asyncio.Event | None = None   # set: ship without lingering (a flush waits)
        self._urgent = False
        self._queue: deque[dict] = deque()
        self._lock = threading.Lock()
        self._shipping: Any = None          # concurrent.futures.Future of the running shipper
        self.sent = self.failed = self.shipments = self.dropped = 0
        self.last_error: BaseException | None = None

    @property
    def topic(self) -> str:
        """The topic given, else ``research.<source>.event-topic`` (read at each shipment)."""
        return self._topic if self._topic is not None else topic(self.source)

    def emit(self, kind: str, run: str | None = None, **fields: Any) -> None:
        """Queue :func:`envelope` ``(source, kind, run or the outbox's run, **fields)``."""
        if self.client is None and self.worker is None:
            return
        self.put(envelope(self.source, kind, run if run is not None else self.run, **fields))

    def put(self, msg: dict) -> None:
        """Queue one ready message; returns at once and never raises."""
        if self.worker is not None:
            self._put_on_worker(msg)
            return
        if self.client is None:
            return
        with self._lock:
            if len(self._queue) >= self.MAX_QUEUED:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    logger.warning("dask-research: more than %d %s events waiting for the scheduler; dropping "
                                   "the oldest (the run goes on)", self.MAX_QUEUED, self.source)
            self._queue.append(msg)
            self._start_locked()

    def _put_on_worker(self, msg: dict) -> None:
        """A worker's event: on its batched stream now (which batches and ships it)."""
        try:
            self.worker.log_event(self.topic, msg)
            self.sent += 1
        except Exception as e:  # noqa: BLE001 - the event log is informational
            self.failed += 1
            self._failed(e)

    def _start_locked(self) -> None:
        """Start a shipper on the client's loop unless one runs (the lock held)."""
        if self._shipping is not None and not self._shipping.done():
            return
        ship = None
        try:
            loop = self.client.loop.asyncio_loop
            ship = self._ship()
            self._shipping = asyncio.run_coroutine_threadsafe(ship, loop)
        except Exception as e:  # noqa: BLE001 - a client without a running loop
            if ship is not None:
                ship.close()
            self._shipping = None
            self.failed += len(self._queue)
            self._queue.clear()
            self._failed(e)

    def _failed(self, error: BaseException) -> None:
        first = self.last_error is None
        self.last_error = error
        (logger.warning if first else logger.debug)(
            "dask-research: could not log %s events (%s: %s); the run goes on without them",
            self.source, type(error).__name__, error)

    async def _ship(self) -> None:
        hurry = asyncio.Event()
        with self._lock:
            self._hurry = hurry
            if self._urgent:
                hurry.set()
        try:
            while True:
                if self.linger > 0 and not hurry.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(hurry.wait(), self.linger)
                with self._lock:
                    if not self._queue:
                        return
                    msgs = list(self._queue)
                    self._queue.clear()
                sent = await self._send(self.topic, msgs)
                self.sent += sent
                self.shipments += 1
        finally:
            # Whatever ends the shipper (the queue empty, the loop cancelling it at shutdown)
            # leaves no stale shipper behind: the next put starts a new one.
            with self._lock:
                self._shipping = self._hurry = None
                self._urgent = False

    async def _send(self, topic_: str, msgs: list[dict]) -> int:
        """Ship ``msgs``; the number sent (failures are counted and logged here)."""
        try:
            if self.batched:
                await scheduler_log_event(self.client, topic_, batch(self.source, self.run, msgs))
                return len(msgs)
            address = str(getattr(self.client.scheduler, "address", ""))
            if address not in _FANOUT:
                await self._probe(address)
            if _FANOUT[address]:
                n = await self._fanout(address, topic_, msgs)
                if n == len(msgs):
                    return n
                _FANOUT[address] = False      # the handler went away: nothing of this was logged
                logger.debug("scheduler %s has no %s handler; one log_event per event",
                             address, HANDLER)
        except Exception as e:  # noqa: BLE001 - e.g. a scheduler going away mid-run
            self.failed += len(msgs)
            self._failed(e)
            return 0
        sent = 0
        for msg in msgs:                      # one entry each: a failure costs that event only
            try:
                await scheduler_log_event(self.client, topic_, msg)
                sent += 1
            except Exception as e:  # noqa: BLE001
                self.failed += 1
                self._failed(e)
        return sent

    async def _probe(self, address: str) -> None:
        """Read from the scheduler's metadata whether it has :data:`HANDLER` (once per address)."""
        meta = await scheduler_call(self.client, "get_metadata", keys=METADATA, default=None)
        _FANOUT[address] = isinstance(meta, dict) and meta.get("handler") == HANDLER
        _PACKED[address] = bool(_FANOUT[address] and meta.get("packed"))
        if not _FANOUT[address]:
            logger.debug("scheduler %s was not preloaded with dask_research.events; one log_event per event",
                         address)

    async def _fanout(self, address: str, topic_: str, msgs: list[dict]) -> Any:
        """One :data:`HANDLER` call for the whole shipment: packed where the handler takes it."""
        body = pack(msgs) if _PACKED.get(address) else None
        if body is not None:
            return await scheduler_call(self.client, HANDLER, topic=topic_, packed=body)
        return await scheduler_call(self.client, HANDLER, topic=topic_, msgs=msgs)

    def _waiting(self) -> Any:
        """The running shipper (or None), told to ship without lingering from now on."""
        with self._lock:
            self._urgent = True
            if self._queue and self.client is not None:
                self._start_locked()      # e.g. after a shipper was cancelled with events left
            shipping, hurry = self._shipping, self._hurry
            if shipping is None:
                self._urgent = False
        if hurry is not None:
            self.client.loop.asyncio_loop.call_soon_threadsafe(hurry.set)
        return shipping

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait (a thread, not the client's loop) until everything queued is sent.

        Returns whether it was all sent in time, without a failure since the outbox was made.
        """
        if self.worker is not None:
            return self.failed == 0          # put already handed each event to the stream
        shipping = self._waiting()
        if shipping is not None:
            try:
                shipping.result(timeout)
            except (TimeoutError, concurrent.futures.TimeoutError):   # still shipping: nothing lost yet
                logger.debug("%s events not flushed within %s s", self.source, timeout)
                return False
            except Exception as e:  # noqa: BLE001 - the log is best effort
                self._failed(e)
                return False
        return self.failed == 0

    async def drain(self) -> bool:
        """:meth:`flush` for a coroutine on the client's loop."""
        if self.worker is not None:
            return self.failed == 0
        shipping = self._waiting()
        if shipping is not None:
            try:
                await asyncio.wrap_future(shipping)
            except asyncio.CancelledError:
                if not shipping.cancelled():
                    raise                     # the caller itself is being cancelled
                return False                  # the shipper was (the loop shutting down)
            except Exception as e:  # noqa: BLE001 - the log is best effort
                self._failed(e)
                return False
        return self.failed == 0
