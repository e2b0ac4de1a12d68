"""Bokeh documents for the research pages (one function per page, like Dask's ``*_doc``)."""
from __future__ import annotations

from .._compat import add_periodic_callback, dashboard_template, dashboard_theme, log_errors
from .components import BranchBoard, ExperiencePanel, ShardBoard


def _page(doc, component, title: str, extra: dict, interval: int = 500) -> None:
    component.update()
    add_periodic_callback(doc, component, interval)
    doc.title = f"Dask: {title}"
    doc.add_root(component.root)
    doc.template = dashboard_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = dashboard_theme()


@log_errors
def shards_doc(scheduler, extra, doc):
    _page(doc, ShardBoard(scheduler, sizing_mode="stretch_width"), "Research Shards", extra)


@log_errors
def experience_doc(scheduler, extra, doc):
    _page(doc, ExperiencePanel(scheduler, sizing_mode="stretch_width"), "Research Experience", extra, 1000)


@log_errors
def branches_doc(scheduler, extra, doc):
    _page(doc, BranchBoard(scheduler, sizing_mode="stretch_width"), "Research Branches", extra)
