"""The events a cluster plane logs on the scheduler (``research.replay.event-topic``).

One :class:`PlaneEvents` per plane writes every event of that plane: ``shard-new``,
``shard-lost``, ``shard-restored`` and ``rebalance``. Each message is the package's one
envelope (:func:`dask_research.events.envelope`, source ``"replay"``) with the plane's name
among its fields, sent with ``client.log_event``; read them with ``client.get_events(topic)``.

Examples
--------
>>> class Client:                     # what PlaneEvents asks of a distributed.Client
...     def log_event(self, topic, msg):
...         print(topic, msg)
>>> PlaneEvents(Client(), "dqn", topic="research.replay").emit("shard-lost", shard=0)  # doctest: +ELLIPSIS
research.replay {'v': 1, 'source': 'replay', 'event': 'shard-lost', 'run': None, 'time': ..., 'plane': 'dqn', 'shard': 0}
"""
from __future__ import annotations

import logging
from typing import Any

from ...events import envelope

logger = logging.getLogger(__name__)


class PlaneEvents:
    """The event log of plane ``name``: one message shape, one topic, never raising.

    >>> class Client:
    ...     def log_event(self, topic, msg):
    ...         raise OSError("scheduler gone")
    >>> PlaneEvents(Client(), "dqn", "research.replay").emit("rebalance", moved=3)   # no error
    """

    def __init__(self, client: Any, plane: str, topic: str):
        self.client = client
        self.plane = plane
        self.topic = topic

    def emit(self, kind: str, **data: Any) -> None:
        """Log event ``kind`` with ``data``; a scheduler going away is logged, not raised."""
        msg = envelope("replay", kind, None, plane=self.plane, **data)
        try:
            self.client.log_event(self.topic, msg)
        except Exception as e:  # a scheduler going away
            logger.debug("could not log %s event: %s", kind, e)
