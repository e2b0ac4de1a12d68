"""Publish an experience plane's statistics to the Dask event log (the Experience page).

The publisher lives in :mod:`dask_research.replay.publish` (planes with a client start one on
their own, without importing the dashboard); this module re-exports it for callers that
publish a plane by hand.

Examples
--------
>>> handle = publish_plane(plane, client, interval=1.0, name="learner-0")   # doctest: +SKIP
>>> handle.stop()                                                             # doctest: +SKIP
"""
from __future__ import annotations

from ..replay.publish import Publisher, auto_publisher, plane_event, publish_plane

__all__ = ["publish_plane", "plane_event", "Publisher", "auto_publisher"]
