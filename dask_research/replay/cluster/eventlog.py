"""The events a cluster plane logs on the scheduler (``research.replay.event-topic``).

One :class:`PlaneEvents` per plane writes every event of that plane: ``shard-new``,
``shard-lost``, ``shard-restored`` and ``rebalance``. Each message is the package's one
envelope (:func:`dask_research.events.envelope`, source ``"replay"``) with the plane's name
among its fields, shipped by the package's one transport (:class:`dask_research.events.Outbox`:
ordered, batched, bounded, never raising); read them with ``client.get_events(topic)``.

Examples
--------
>>> events = PlaneEvents(None, "dqn", topic="research.replay")      # None: nothing is shipped
>>> msg = events.message("shard-lost", shard=0)
>>> msg["source"], msg["event"], msg["plane"], msg["shard"]
('replay', 'shard-lost', 'dqn', 0)
"""
from __future__ import annotations

from typing import Any

from ...events import Outbox, envelope


class PlaneEvents:
    """The event log of plane ``name``: one message shape, one topic, one outbox, never raising."""

    def __init__(self, client: Any, plane: str, topic: str):
        self.client = client
        self.plane = plane
        self.topic = topic
        self.outbox = Outbox(client, "replay", topic=topic)

    def message(self, kind: str, **data: Any) -> dict[str, Any]:
        """The envelope of event ``kind`` with ``data`` and the plane's name."""
        return envelope("replay", kind, None, plane=self.plane, **data)

    def emit(self, kind: str, **data: Any) -> None:
        """Log event ``kind`` with ``data``; returns at once (a scheduler going away is logged, not raised)."""
        self.outbox.put(self.message(kind, **data))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event emitted so far is shipped (see :meth:`~dask_research.events.Outbox.flush`)."""
        return self.outbox.flush(timeout)
