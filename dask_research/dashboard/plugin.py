"""The scheduler plugin that folds the research events as the scheduler logs them.

The scheduler keeps the last ``distributed.admin.low-level-log-length`` entries of a topic
(1,000 by default). A page that folded the log itself when it was opened showed nothing of a
run whose ``start`` had already left the log (a long run logs far more than 1,000 entries), and
its first update read the whole log (about 2.9 s of the scheduler's event loop at 300,000
batched events). :class:`ResearchEventsPlugin` is a Dask ``SchedulerPlugin``: the scheduler
calls its ``log_event`` hook for every event it logs, on its event loop, and the plugin feeds
the events of the research topics into the same folds the pages draw (:class:`.ShardFold`,
:class:`.BranchFold`, :class:`.PlaneFold`), from the moment it is installed. A page reads the
plugin's fold: an update costs the drawing, never the log, and a page opened late shows the
whole of the run it finds. It is an observer only: events travel as before (one transport,
:mod:`dask_research.events`), and the log itself is untouched.

Memory is bounded whatever the number of runs: each fold holds one run, the latest (a Monte-Carlo
``start`` or an experiments ``add`` of another run replaces the one held, so a finished run is
forgotten as soon as the next one starts), each within its own bounds (4,096 cells and the last
:attr:`.ShardFold.MAX_ENDS` end events; score lines of :attr:`.BranchFold.MAX_POINTS` points and
:attr:`.BranchFold.MAX_OCCUPANCY` slot-use points), and the Experience fold follows at most
:attr:`.PlaneFold.MAX_PLANES` planes of :attr:`.PlaneFold.MAX_POINTS` points each.

:func:`install` puts it on a scheduler: the ``dask_research.dashboard`` preload does (``dask
scheduler --preload dask_research.dashboard``, the embedded cluster), before any client
connects; a scheduler whose pages were registered by importing :mod:`dask_research.dashboard`
alone gets it when the first research page is opened, folding in what the log holds then (once).
An event a fold cannot read is skipped with one warning, when it is logged.

Examples
--------
>>> plugin = ResearchEventsPlugin()
>>> plugin.log_event("research.montecarlo", {"event": "start", "run": "r", "shards": 4, "key_prefix": "p"})
>>> plugin.log_event("research.montecarlo", {"event": "accepted", "run": "r", "start": 0, "stop": 3})
>>> plugin.log_event("research.montecarlo", {"event": "done", "run": "r"})
>>> plugin.folds["montecarlo"].cells.shard_counts()["accepted"]
3
>>> plugin.log_event("research.montecarlo", {"event": "start", "run": "r2", "shards": 8, "key_prefix": "q"})
>>> plugin.held()["montecarlo"]          # the next run replaces the one held
['r2']
"""
from __future__ import annotations

import logging
from typing import Any

from distributed import SchedulerPlugin

from .._compat import DaskCompatError, add_scheduler_plugin, scheduler_plugin, scheduler_plugins_see_events
from ..events import topic, unpack
from .folds import BranchFold, PlaneFold, ShardFold, feed_event

logger = logging.getLogger(__name__)

__all__ = ["ResearchEventsPlugin", "PLUGIN_NAME", "install", "folds_of"]

#: The name the plugin runs under on the scheduler.
PLUGIN_NAME = "dask-research-dashboard"

#: Why a plugin could not be installed, once said (the warning is given once per process).
_WARNED: list[str] = []

#: The page of each subsystem folded (the name its warnings give).
PAGES = {"montecarlo": "Shards", "experiments": "Branches", "replay": "Experience"}


class ResearchEventsPlugin(SchedulerPlugin):
    """Folds each research event into its page's fold as the scheduler logs it.

    ``folds`` maps a subsystem (``montecarlo``, ``experiments``, ``replay``) to its fold; the
    topics are read from ``research.<subsystem>.event-topic`` when the plugin is made. The hook
    runs on the scheduler's event loop, as the pages' updates do, and costs what a page's fold
    of the event costs (a few dictionary operations; the cells an ``accepted`` range touches).
    See the module docstring for the memory bounds.
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.topics: dict[str, str] = {topic(s): s for s in PAGES}
        self.folds: dict[str, Any] = {"montecarlo": ShardFold(), "experiments": BranchFold(), "replay": PlaneFold()}

    def log_event(self, topic: str, msg: Any) -> None:
        """The scheduler logged ``msg`` on ``topic``: fold it in (a batch's events one by one)."""
        subsystem = self.topics.get(topic) if isinstance(topic, str) else None
        if subsystem is None:
            return
        fold, page = self.folds[subsystem], PAGES[subsystem]
        for _, event in unpack(((0.0, msg),)):
            feed_event(fold, event, page)

    def seed(self, scheduler: Any) -> None:
        """Fold in what the scheduler's log holds now (once, when the plugin is installed)."""
        for name, subsystem in self.topics.items():
            fold, page = self.folds[subsystem], PAGES[subsystem]
            for _, event in unpack(scheduler.get_events(name)):
                feed_event(fold, event, page)

    def held(self) -> dict[str, list]:
        """What the plugin holds: the run of each fold (at most one), and the planes followed.

        >>> ResearchEventsPlugin().held()
        {'montecarlo': [], 'experiments': [], 'replay': []}
        """
        shards, branches, planes = self.folds["montecarlo"], self.folds["experiments"], self.folds["replay"]
        return {"montecarlo": [] if shards.start is None else [shards.start["run"]],
                "experiments": [branches.run] if branches.started else [],
                "replay": list(planes.series)}


def install(scheduler: Any) -> ResearchEventsPlugin | None:
    """Run a :class:`ResearchEventsPlugin` on ``scheduler`` (on its event loop), or return the one
    it runs; it first folds in what the log holds. ``None`` where the scheduler cannot run it (a
    Dask that never calls ``SchedulerPlugin.log_event``, or that moved its plugin table; said
    once per process in the log): the pages then read the log themselves, as before.
    """
    existing = scheduler_plugin(scheduler, PLUGIN_NAME)
    if existing is not None:
        return existing if isinstance(existing, ResearchEventsPlugin) else None
    try:
        if not scheduler_plugins_see_events():
            raise DaskCompatError("this distributed never calls SchedulerPlugin.log_event")
        plugin = ResearchEventsPlugin()
        plugin.seed(scheduler)
        add_scheduler_plugin(scheduler, plugin, PLUGIN_NAME)
    except DaskCompatError as e:
        if _WARNED:
            return None
        _WARNED.append(str(e))
        logger.warning("dask_research.dashboard: the research pages read the scheduler's event log "
                       "themselves (they show what it still holds): %s", e)
        return None
    return plugin


def folds_of(scheduler: Any) -> dict[str, Any] | None:
    """The folds of the plugin ``scheduler`` runs (subsystem -> fold), or ``None`` where it runs none."""
    plugin = scheduler_plugin(scheduler, PLUGIN_NAME)
    return plugin.folds if isinstance(plugin, ResearchEventsPlugin) else None
