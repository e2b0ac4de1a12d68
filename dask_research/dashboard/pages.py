"""Bokeh documents for the research pages (one function per page, like Dask's ``*_doc``).

Each ``*_doc(scheduler, extra, doc)`` fills a Bokeh document with one component of
:mod:`.components`, refreshed every half second (the Experience page every second) while the
page is open, in the template and theme of Dask's own pages. The dashboard routes
``/research/shards``, ``/research/experience`` and ``/research/branches`` to them
(:mod:`dask_research.dashboard`).

Examples
--------
>>> from bokeh.document import Document
>>> from distributed import LocalCluster
>>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
...     doc = Document()
...     shards_doc(cluster.scheduler, {}, doc)
...     doc.title, len(doc.roots)
('Dask: Research Shards', 1)
"""
from __future__ import annotations

from .._compat import add_periodic_callback, dashboard_template, dashboard_theme, log_errors
from .components import BranchBoard, ExperiencePanel, ShardBoard
from .plugin import install


def _page(doc, scheduler, board, title: str, extra: dict, interval: int = 500) -> None:
    """Fill ``doc`` with a ``board`` of ``scheduler``, after making sure it runs the research
    plugin (:func:`.plugin.install`: a scheduler whose pages were registered by import alone
    gets it at the first page opened), so the page reads the plugin's folds."""
    install(scheduler)
    component = board(scheduler, sizing_mode="stretch_width")
    component.update()
    add_periodic_callback(doc, component, interval)
    doc.title = f"Dask: {title}"
    doc.add_root(component.root)
    doc.template = dashboard_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = dashboard_theme()


@log_errors
def shards_doc(scheduler, extra, doc):
    _page(doc, scheduler, ShardBoard, "Research Shards", extra)


@log_errors
def experience_doc(scheduler, extra, doc):
    _page(doc, scheduler, ExperiencePanel, "Research Experience", extra, 1000)


@log_errors
def branches_doc(scheduler, extra, doc):
    _page(doc, scheduler, BranchBoard, "Research Branches", extra)
