"""Self-contained HTML reports (bokeh, inline resources: one file that opens offline).

A report opens with the facts needed to trust and repeat it: when and where it was made, the
versions, the seeds, the run store and the command that replays a stored shard
(:func:`environment_facts` gathers the common ones). Plots have a fixed frame size with their
legends outside the frame, so no legend covers data and no title is cut.

Examples
--------
>>> from dask_research.html_report import write_report, montecarlo_figure   # doctest: +SKIP
>>> write_report("report.html", "My runs", [montecarlo_figure(result)],
...              facts={"seed": "2026"})                               # doctest: +SKIP
"""
from __future__ import annotations

import datetime
import html
import math
import os
import platform
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from .durable import Files
from .exceptions import ReportError

#: Largest report written (a demo report with inline BokehJS is a few MiB).
REPORT_CAP = 1 << 30

__all__ = ["montecarlo_figure", "write_report", "environment_facts", "outside_legend", "FRAME_WIDTH", "LEGEND_CHARS"]

#: Width in CSS pixels of every plot's data frame; with its axis and a legend of labels up to
#: :data:`LEGEND_CHARS` characters beside it, a plot fits a 1000-pixel-wide window.
FRAME_WIDTH = 600
#: The longest legend label a plot of the report uses.
LEGEND_CHARS = 40


def outside_legend(fig, place: str = "right") -> None:
    """Move the legend that ``legend_label=`` built out of the data frame (never over the data)."""
    legend = fig.legend[0]
    fig.center = [r for r in fig.center if r is not legend]
    legend.location = "top_left" if place == "right" else "center"
    legend.click_policy = "hide"
    fig.add_layout(legend, place)


def montecarlo_figure(result, level: float = 0.95):
    """The output histogram (density), the delta-method normal over it, and both kinds of interval.

    Parameters
    ----------
    result : dask_research.montecarlo.Result
        A finished run with the default moments reducer.
    level : float
        The level of the intervals drawn and quoted.

    Returns
    -------
    bokeh.models.Column
        The figure and a note that quotes the numbers.
    """
    from bokeh.layouts import column
    from bokeh.models.widgets import Div
    from bokeh.plotting import figure

    pct = f"{level * 100:g} %"
    edges, counts = result.histogram
    width = np.diff(edges)
    density = counts / max(1, result.n) / width
    top = float(density.max()) * 1.05 if density.size else 1.0
    fig = figure(title=f"Monte-Carlo: {result.name or result.run_id[:12]} ({result.n:,} samples)",
                 frame_width=FRAME_WIDTH, frame_height=300, x_axis_label="pipeline output",
                 y_axis_label="probability density", toolbar_location="above")
    iv = result.interval(level)
    fig.quad(top=top, bottom=0, left=iv.percentile[0], right=iv.percentile[1], fill_color="#55a868",
             fill_alpha=0.15, line_color=None,
             legend_label=f"output {pct} sampled [{iv.percentile[0]:.4g}, {iv.percentile[1]:.4g}]")
    fig.quad(top=density, bottom=0, left=edges[:-1], right=edges[1:], fill_color="#4c72b0",
             line_color=None, alpha=0.6, legend_label="sampled histogram")
    lo, hi = result.quantile([0.0005, 0.9995])
    xs = np.linspace(lo, hi, 400)
    lin = result.linearized
    if lin is not None and lin.sd > 0 and math.isfinite(lin.sd):
        pdf = np.exp(-0.5 * ((xs - lin.value) / lin.sd) ** 2) / (lin.sd * math.sqrt(2 * math.pi))
        fig.line(xs, pdf, line_color="#c44e52", line_width=2,
                 legend_label=f"delta method N(g(mu)={lin.value:.4g}, sd={lin.sd:.3g})")
    fig.segment(x0=list(iv.normal), y0=[0, 0], x1=list(iv.normal), y1=[top, top], line_color="#dd8452",
                line_dash="dashed", line_width=2, legend_label=f"output {pct} normal (mean ± {_z(level):.3g} sd)")
    from .montecarlo.result import mean_pm, mean_text

    fig.segment(x0=[result.mean], y0=[0], x1=[result.mean], y1=[top], line_color="black", line_width=1.5,
                legend_label=f"mean {mean_pm(result.mean, result.stderr, level)} ({pct} CI)")
    fig.y_range.update(start=0)
    fig.x_range.update(**data_extent(lo, hi, [*iv.normal, *iv.percentile]))
    outside_legend(fig)
    note = Div(text=(f"<p style='max-width:{FRAME_WIDTH + 300}px'>The mean: {html.escape(mean_text(result.mean, result.stderr, level))}; "
                     "quote this for the estimate (the interval is mean ± z·stderr). The bands "
                     f"drawn are where {pct} of the <i>outputs</i> fall: sampled percentiles (green) "
                     f"[{iv.percentile[0]:.4g}, {iv.percentile[1]:.4g}] and the normal approximation "
                     f"mean ± z·sd (dashed) [{iv.normal[0]:.4g}, {iv.normal[1]:.4g}], about "
                     f"sqrt(n) = {math.sqrt(result.n):,.0f} times wider.</p>"))
    return column(fig, note)


def data_extent(lo: float, hi: float, marks: Sequence[float] = (), pad: float = 0.03) -> dict[str, float]:
    """An x range from ``lo`` to ``hi`` (the data's 0.05 and 99.95 percentiles) and the marks
    drawn over it, padded by ``pad`` of its width: neither the frozen histogram range's margin
    nor a few far outliers fill the picture.

    >>> data_extent(0.32, 0.83, [0.43, 0.74])
    {'start': 0.3047, 'end': 0.8453}
    """
    lo = min([float(lo), *[float(m) for m in marks if math.isfinite(m)]])
    hi = max([float(hi), *[float(m) for m in marks if math.isfinite(m)]])
    margin = pad * (hi - lo) if hi > lo else 1.0
    return {"start": round(lo - margin, 12), "end": round(hi + margin, 12)}


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def environment_facts(client=None) -> dict[str, str]:
    """Date, host, versions and (with ``client``) the cluster: the header every report carries."""
    import dask
    import distributed

    from . import __version__

    versions = [f"dask-research {__version__}", f"Dask {dask.__version__}",
                f"distributed {distributed.__version__}", f"NumPy {np.__version__}"]
    try:
        import bokeh

        versions.append(f"bokeh {bokeh.__version__}")
    except ImportError:  # pragma: no cover - write_report needs bokeh anyway
        pass
    versions.append(f"Python {platform.python_version()}")
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": f"{socket.gethostname()} ({platform.platform()}, {os.cpu_count()} CPUs)",
        "versions": ", ".join(versions),
    }
    if client is not None:
        try:
            info = client.scheduler_info(n_workers=-1)
        except TypeError:  # older signature
            info = client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(int(w.get("nthreads", 0)) for w in workers.values())
        facts["cluster"] = f"scheduler {info.get('address', '?')}, {len(workers)} workers, {threads} threads"
    return facts


def _facts_table(facts: dict[str, str]) -> str:
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em;vertical-align:top'>{html.escape(k)}</th>"
                   f"<td class='fact' data-fact='{html.escape(k)}'>{html.escape(str(v))}</td></tr>"
                   for k, v in facts.items())
    return f"<table class='facts' style='font-size:90%'>{rows}</table>"


def write_report(path: str, title: str, sections: list[Any], facts: dict[str, str] | None = None) -> str:
    """Write ``sections`` (bokeh models or HTML strings) into one self-contained HTML file.

    Parameters
    ----------
    path : str
        The file to write; it is replaced in one rename (see :class:`~dask_research.durable.Files`), so a
        failure leaves no partial file; a link or a special file at ``path`` is refused
        (:class:`~dask_research.exceptions.ReportError`).
    title : str
        The page's title and heading.
    sections : list
        Bokeh models, or strings of HTML, in order.
    facts : dict, optional
        Shown as a table under the heading (e.g. :func:`environment_facts` plus seeds and the
        run store).

    Returns
    -------
    str
        ``path``.
    """
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models.widgets import Div
    from bokeh.resources import INLINE

    models = [Div(text=f"<h1>{html.escape(title)}</h1>" + (_facts_table(facts) if facts else ""))]
    for s in sections:
        models.append(Div(text=s) if isinstance(s, str) else s)
    page = file_html(column(*models), INLINE, title)
    folder, name = os.path.split(os.path.abspath(path))
    files = Files(folder, error=ReportError)
    files.write_bytes(files.join(name), page.encode("utf-8"), cap=REPORT_CAP, replace=True)
    return path

