"""Self-contained HTML reports (bokeh, inline resources: one file that opens offline).

Examples
--------
>>> from dask_research.report import write_report       # doctest: +SKIP
>>> write_report("report.html", "My runs", [montecarlo_figure(result)])   # doctest: +SKIP
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["montecarlo_figure", "write_report"]


def montecarlo_figure(result, level: float = 0.95):
    """The output histogram (density), the delta-method normal over it, and both intervals."""
    from bokeh.models import BoxAnnotation, Legend, Span
    from bokeh.plotting import figure

    edges, counts = result.histogram
    width = np.diff(edges)
    density = counts / max(1, result.n) / width
    fig = figure(title=f"Monte-Carlo: {result.name} ({result.n:,} samples)", height=360, width=760,
                 x_axis_label="output", y_axis_label="density", toolbar_location="above")
    hist = fig.quad(top=density, bottom=0, left=edges[:-1], right=edges[1:], fill_color="#4c72b0",
                    line_color=None, alpha=0.6)
    items = [("sampled histogram", [hist])]
    lo, hi = result.quantile([0.0005, 0.9995])
    xs = np.linspace(lo, hi, 400)
    lin = result.linearized
    if lin is not None and lin.sd > 0 and math.isfinite(lin.sd):
        pdf = np.exp(-0.5 * ((xs - lin.value) / lin.sd) ** 2) / (lin.sd * math.sqrt(2 * math.pi))
        line = fig.line(xs, pdf, line_color="#c44e52", line_width=2)
        items.append((f"delta method N(g(mu)={lin.value:.4g}, sd={lin.sd:.3g})", [line]))
    iv = result.interval(level)
    fig.add_layout(BoxAnnotation(left=iv.percentile[0], right=iv.percentile[1], fill_color="#55a868",
                                 fill_alpha=0.12))
    for x in iv.normal:
        fig.add_layout(Span(location=x, dimension="height", line_color="#dd8452", line_dash="dashed",
                            line_width=2))
    mean = fig.line([result.mean, result.mean], [0, float(density.max()) * 1.05], line_color="black")
    items.append((f"sampled mean {result.mean:.4g} ± {result.stderr:.2g}", [mean]))
    fig.add_layout(Legend(items=items, location="top_left"))
    from bokeh.layouts import column
    from bokeh.models import Div

    note = Div(text=(f"{int(level * 100)} % intervals of the output: sampled percentiles (green band) "
                     f"[{iv.percentile[0]:.4g}, {iv.percentile[1]:.4g}]; normal approximation mean ± z·sd "
                     f"(dashed) [{iv.normal[0]:.4g}, {iv.normal[1]:.4g}]"))
    return column(fig, note)


def write_report(path: str, title: str, sections: list[Any]) -> str:
    """Write ``sections`` (bokeh models or HTML strings) into one self-contained HTML file."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import Div
    from bokeh.resources import INLINE

    models = [Div(text=f"<h1>{title}</h1>")]
    for s in sections:
        models.append(Div(text=s) if isinstance(s, str) else s)
    html = file_html(column(*models), INLINE, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path
