"""Publish an in-process experience plane's statistics to the Dask event log.

The dashboard's Experience page reads ``stats`` events from the topic
``research.replay``; :func:`publish_plane` sends one every ``interval`` seconds from a daemon
thread (numbers only: sizes, rates, latencies; never transitions).

Examples
--------
>>> handle = publish_plane(plane, client, interval=1.0, name="learner-0")   # doctest: +SKIP
>>> handle.stop()                                                             # doctest: +SKIP
"""
from __future__ import annotations

import threading
import time
from typing import Any

from .. import config

__all__ = ["publish_plane", "plane_event", "Publisher"]


def plane_event(stats: dict, name: str) -> dict[str, Any]:
    """The compact, msgpack-friendly ``stats`` event for one plane."""
    d = stats.get("delivery") or {}
    return {
        "event": "stats", "plane": name, "t": time.time(),
        "size": int(stats.get("size", 0)), "capacity": int(stats.get("capacity", 0)),
        "inserted": int(stats.get("inserted", 0)), "sampled": int(stats.get("sampled", 0)),
        "tiers": [{"name": str(t.get("name")), "used": int(t.get("used", 0)), "rows": int(t.get("rows", 0))}
                  for t in stats.get("tiers", [])],
        "exposed_mean_s": float(d.get("exposed_mean_s") or 0.0),
        "exposed_p99_s": float(d.get("exposed_p99_s") or 0.0),
        "step_mean_s": float(d.get("step_mean_s") or 0.0),
        "batches": int(d.get("batches") or 0),
    }


class Publisher:
    """A daemon thread that logs a plane's stats until :meth:`stop`."""

    def __init__(self, plane, client, interval: float, name: str):
        self.plane, self.client, self.interval, self.name = plane, client, interval, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"publish-{name}", daemon=True)
        self.sent = 0

    def _loop(self) -> None:
        topic = str(config.get("replay.event-topic"))
        while not self._stop.wait(self.interval):
            self.publish_once(topic)

    def publish_once(self, topic: str | None = None) -> None:
        topic = topic or str(config.get("replay.event-topic"))
        try:
            self.client.log_event(topic, plane_event(self.plane.stats(), self.name))
            self.sent += 1
        except Exception:  # the scheduler may be closing; the plane must not care
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.publish_once()


def publish_plane(plane, client, interval: float = 1.0, name: str = "plane") -> Publisher:
    """Start publishing ``plane.stats()`` to ``client``'s scheduler every ``interval`` seconds."""
    pub = Publisher(plane, client, interval, name)
    pub._thread.start()
    return pub
