"""Publish an experience plane's statistics to the Dask event log.

The dashboard's Experience page reads ``stats`` events (in the envelope of
:mod:`dask_research.events`) from the topic ``research.replay.event-topic``. Every plane with a client publishes on its own: a
:class:`~dask_research.replay.ClusterPlane` always, an
:class:`~dask_research.replay.ExperiencePlane` when given ``client=``, every
``research.replay.publish-interval`` seconds (``null``: never) from a daemon thread. Events
carry numbers only (sizes, rates, latencies; never transitions). :func:`publish_plane` starts
the same publisher by hand, for a plane made without a client.

Examples
--------
>>> handle = publish_plane(plane, client, interval=1.0, name="learner-0")   # doctest: +SKIP
>>> handle.stop()                                                             # doctest: +SKIP
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import config
from .._compat import client_status
from ..events import Outbox, envelope

__all__ = ["publish_plane", "plane_event", "Publisher", "auto_publisher"]


def _tiers(stats: dict) -> list[dict[str, Any]]:
    """Occupancy rows: a plane's tiers, or a cluster plane's live shards."""
    if "tiers" in stats:
        return [{"name": str(t.get("name")), "used": int(t.get("used", 0)), "rows": int(t.get("rows", 0))}
                for t in stats.get("tiers", [])]
    return [{"name": f"shard {s.get('id')} ({s.get('address')})", "used": int(s.get("size", 0)),
             "rows": int(s.get("capacity", 0))}
            for s in stats.get("shards", []) if not s.get("lost")]


def plane_event(stats: dict, name: str) -> dict[str, Any]:
    """The compact, msgpack-friendly ``stats`` event for one plane (single-process or cluster).

    An :func:`dask_research.events.envelope` (source ``replay``, no run) whose ``t`` repeats
    its ``time`` for the readers of the shape before the envelope.

    >>> ev = plane_event({"size": 3, "capacity": 8, "tiers": []}, "learner-0")
    >>> ev["source"], ev["event"], ev["plane"], ev["size"], ev["t"] == ev["time"]
    ('replay', 'stats', 'learner-0', 3, True)
    """
    d = stats.get("delivery") or {}
    now = time.time()
    return envelope(
        "replay", "stats", None, time=now, plane=name, t=now,
        size=int(stats.get("size", 0)), capacity=int(stats.get("capacity", 0)),
        inserted=int(stats.get("inserted", 0)), sampled=int(stats.get("sampled", 0)),
        tiers=_tiers(stats),
        exposed_mean_s=float(d.get("exposed_mean_s") or 0.0),
        exposed_p99_s=float(d.get("exposed_p99_s") or 0.0),
        step_mean_s=float(d.get("step_mean_s") or 0.0),
        batches=int(d.get("batches") or 0),
    )


def _default_stats(plane: Any) -> dict:
    try:
        return plane.stats(refresh=False)       # a cluster plane: its table, no worker round trip
    except TypeError:
        return plane.stats()


class Publisher:
    """A daemon thread that logs a plane's stats every ``interval`` seconds until :meth:`stop`.

    It holds the plane weakly and ends by itself when the plane is garbage-collected or the
    client closes. ``stats`` (default: ``plane.stats()``, without a cluster refresh) gives the
    numbers.
    """

    def __init__(self, plane: Any, client: Any, interval: float, name: str,
                 stats: Callable[[Any], dict] | None = None):
        self._plane = weakref.ref(plane)
        self.client, self.interval, self.name = client, float(interval), name
        self._stats = stats or _default_stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"publish-{name}", daemon=True)
        self._outbox = Outbox(client, "replay")
        self.sent = 0
        self.last_error: BaseException | None = None

    @property
    def plane(self) -> Any:
        return self._plane()

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def _client_closed(self) -> bool:
        return client_status(self.client) in ("closing", "closed")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self._plane() is None or self._client_closed():
                return
            self.publish_once()

    def publish_once(self, topic: str | None = None) -> bool:
        """Log one ``stats`` event now; False (and ``last_error`` set) if it could not be sent."""
        plane = self._plane()
        if plane is None:
            return False
        try:
            msg = plane_event(self._stats(plane), self.name)
        except Exception as e:  # the plane may be closing; the publisher must not care
            self.last_error = e
            return False
        box = self._outbox if topic is None else Outbox(self.client, "replay", topic=topic)
        sent, failed = box.sent, box.failed
        box.put(msg)
        box.flush(max(self.interval, 1.0))
        if box.sent == sent or box.failed > failed:      # not shipped in time, or failed
            self.last_error = box.last_error
            return False
        self.sent += 1
        return True

    def stop(self, final: bool = True) -> None:
        """Stop the thread; with ``final``, publish the last figures once more."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if final and not self._client_closed():
            self.publish_once()


def publish_plane(plane: Any, client: Any, interval: float = 1.0, name: str = "plane") -> Publisher:
    """Start publishing ``plane.stats()`` to ``client``'s scheduler every ``interval`` seconds."""
    return Publisher(plane, client, interval, name).start()


def auto_publisher(plane: Any, client: Any, name: str, interval: float | None = None) -> Publisher | None:
    """The publisher a plane with a client starts for itself.

    ``interval`` None reads ``research.replay.publish-interval``; 0 (or a null config value)
    means no publishing and returns None.
    """
    iv = config.resolve("replay.publish-interval", interval, default=None)
    if iv is None or client is None:
        return None
    try:
        iv = float(iv)
    except (TypeError, ValueError):
        iv = float("nan")
    if not iv >= 0:
        from ..exceptions import InputError

        raise InputError("publish_interval", interval if interval is not None else iv,
                         "a number of seconds > 0, or 0 for no publishing "
                         "(research.replay.publish-interval: null)", where=f"plane {name!r}")
    if iv == 0:
        return None
    return Publisher(plane, client, iv, name).start()
