"""Bokeh pages for the Dask dashboard: Shards, Branches, Experience.

Load it as a scheduler preload::

    dask scheduler --preload dask_research.dashboard

(automatic for the embedded ``LocalCluster``). Importing the module registers the pages with
the Dask dashboard before the scheduler connects it; they appear in the dashboard's "More..."
menu as *Research Shards*, *Research Branches* and *Research Experience* and are fed by the
scheduler's event log (topics ``research.montecarlo``, ``research.experiments``,
``research.replay``), so they show the work of any client connected to that scheduler. The
pages are read-only views: no route changes state.

The preload also installs the research plugin (:mod:`.plugin`), which folds each event into
the pages' state as the scheduler logs it: a page opened at any time shows the whole of the
latest run, though the scheduler's log keeps only its last
``distributed.admin.low-level-log-length`` entries per topic, and an update costs the drawing,
never the log. Where the pages were registered by importing this module alone (a
``LocalCluster`` of your own), the plugin is installed when the first page is opened and folds
in what the log holds then; pass ``scheduler_kwargs={"preload": ["dask_research.dashboard"]}``
to fold from the scheduler's start.

Examples
--------
>>> import dask_research.dashboard as dash
>>> sorted(dash.ROUTES)
['/individual-research-branches', '/individual-research-experience', '/individual-research-shards']
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: Dashboard routes this package adds (the "individual-" prefix puts them in "More...").
ROUTES = {
    "/individual-research-shards": "shards_doc",
    "/individual-research-branches": "branches_doc",
    "/individual-research-experience": "experience_doc",
}


def register() -> bool:
    """Add the pages to ``distributed.dashboard.scheduler.applications`` (idempotent).

    Returns False when bokeh is not installed (the pages need the ``[dashboard]`` extra).
    """
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    from .._compat import dashboard_applications
    from . import pages

    applications = dashboard_applications()
    for route, name in ROUTES.items():
        applications.setdefault(route, getattr(pages, name))
    return True


def dask_setup(scheduler) -> None:
    """Preload hook: the pages registered at import; here the research plugin installed
    (:func:`dask_research.dashboard.plugin.install`: the pages' folds see every event from the
    scheduler's start, so a page opened late shows the whole run), and the events handler
    (:func:`dask_research.events.install`), so producers ship many events per round trip."""
    from .. import events

    if register():
        from .plugin import install

        install(scheduler)
    else:
        logger.warning("dask_research.dashboard: bokeh is not installed, so the research pages "
                       "(/individual-research-shards, -branches, -experience) are not served: "
                       "pip install 'dask-research[dashboard]' where the scheduler runs")
    events.install(scheduler)


register()
