"""The README's main job: `dask-research demo` runs all three capabilities and writes a report.

The report is read back the way a reader would: its header facts, every plot's full title,
both axis labels and a legend entry for every series (from the bokeh document embedded in the
HTML), and the replay command it prints is run, from another directory, as printed.
"""
import contextlib
import html as html_module
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("bokeh")

import dask  # noqa: E402
import distributed  # noqa: E402
import numpy  # noqa: E402
import numpy as np  # noqa: E402

import dask_research  # noqa: E402
from dask_research import demo as demo_module  # noqa: E402
from dask_research.cli import main  # noqa: E402
from dask_research.demo import BRANCH_MEANS, SEED, STORE_NAME, check_out_path, check_store_path, run_demo  # noqa: E402
from dask_research.exceptions import InputError  # noqa: E402
from dask_research.html_report import FRAME_WIDTH, LEGEND_CHARS  # noqa: E402

#: A generous width per character of a 13 px bold sans-serif title (Liberation Sans Bold, the
#: Helvetica that bokeh asks for, averages about 7 px).
TITLE_PX_PER_CHAR = 8


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("demo")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    where = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        res = run_demo(out=str(where / "report.html"), quick=True)
    return where, res, printed.getvalue()


def _bokeh_objects(html):
    """Every bokeh model of the documents embedded in the page, by id."""
    blocks = re.findall(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', html, flags=re.S)
    assert blocks, "no bokeh document in the report"
    objs = {}

    def walk(x):
        if isinstance(x, dict):
            if x.get("type") == "object" and "id" in x and "attributes" in x:
                objs[x["id"]] = x
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for b in blocks:
        walk(json.loads(html_module.unescape(b)))       # bokeh escapes the document for the page
    return objs


def _resolve(objs, ref):
    return objs[ref["id"]] if isinstance(ref, dict) and "id" in ref else ref


def _figures(html):
    """``[{title, x, y, legend, renderers, frame_width}]`` for every plot of the report."""
    objs = _bokeh_objects(html)
    out = []
    for fig in (o for o in objs.values() if o["name"] == "Figure"):
        a = fig["attributes"]
        title = _resolve(objs, a["title"])["attributes"]["text"]
        axes = {side: [_resolve(objs, ax)["attributes"].get("axis_label") for ax in a.get(side, [])
                       if _resolve(objs, ax)["name"].endswith("Axis")] for side in ("below", "left")}
        legends = [_resolve(objs, x) for side in ("right", "center", "left", "below", "above")
                   for x in a.get(side, []) if _resolve(objs, x)["name"] == "Legend"]
        labels, covered = [], set()
        for lg in legends:
            for item in lg["attributes"]["items"]:
                item = _resolve(objs, item)["attributes"]
                labels.append(item["label"]["value"])
                covered.update(r["id"] for r in item["renderers"])
        renderers = [r["id"] for r in a.get("renderers", [])]
        out.append({"title": title, "x": axes["below"], "y": axes["left"], "legend": labels,
                    "inside": [lg for lg in legends if lg in [_resolve(objs, x) for x in a.get("center", [])]],
                    "uncovered": [r for r in renderers if r not in covered], "frame_width": a.get("frame_width")})
    return out


def _facts(html):
    """The header table: ``data-fact`` cells of the report's Div models."""
    texts = [o["attributes"].get("text", "") for o in _bokeh_objects(html).values() if o["name"] == "Div"]
    return {k: html_module.unescape(v) for t in texts
            for k, v in re.findall(r"data-fact='([^']+)'>(.*?)</td>", t)}


def test_demo_runs_everything_and_writes_a_self_contained_report(demo):
    where, res, printed = demo
    html = (where / "report.html").read_text()
    # self-contained: bokeh inline, no external scripts
    assert "Bokeh" in html and not re.search(r'<script[^>]+src="http', html)
    for section in ("1. Monte-Carlo", "2. Experiments", "3. Experience replay"):
        assert section in html
    mc = res.montecarlo
    assert mc.n == 64 * 65_536 and mc.verification["mismatches"] == []
    assert abs(mc.mean - 0.5845) < 0.002 and mc.linearized.value > mc.mean  # the delta method overshoots
    rep = res.experiments
    assert rep.stop_reason == "max_experiments" and rep.total_runs == 60
    assert set(rep.branches) == set(BRANCH_MEANS)
    stats = res.replay_stats
    assert stats["sampled"] >= 300 * 256 and len(res.exposed_ms) == 300
    assert "Dashboard:" in printed and "individual-research-shards" in printed and "Report:" in printed


def test_report_header_has_date_versions_seeds_host_and_the_store(demo):
    where, res, _ = demo
    facts = _facts((where / "report.html").read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", facts["date"]), facts
    for name, version in (("dask-research", dask_research.__version__), ("Dask", dask.__version__),
                          ("distributed", distributed.__version__), ("NumPy", numpy.__version__)):
        assert f"{name} {version}" in facts["versions"], facts["versions"]
    assert "Python 3." in facts["versions"]
    assert f"seed {SEED}" in facts["seeds"] and "scheduler seed" in facts["seeds"] and "actor seed" in facts["seeds"]
    import socket

    assert socket.gethostname() in facts["host"]
    assert "2 workers" in facts["cluster"]
    assert facts["run store"] == str(where / STORE_NAME) == res.store
    assert facts["Monte-Carlo run"] == res.montecarlo.run_id
    assert facts["replay a shard"] == res.replay_command


def test_the_report_quotes_the_mean_as_the_cli_and_the_summary_do(demo):
    import html

    from dask_research.montecarlo.result import mean_text

    where, res, _ = demo
    objs = _bokeh_objects((where / "report.html").read_text())
    notes = [o["attributes"].get("text", "") for o in objs.values() if o["name"] == "Div"]
    line = mean_text(res.montecarlo.mean, res.montecarlo.stderr)
    assert any(f"The mean: {html.escape(line)}; quote this" in t for t in notes), notes
    assert line in str(res.montecarlo)                       # print(result) says the same


def test_every_plot_has_its_full_title_both_axis_labels_and_a_legend_outside_the_data(demo):
    where, res, _ = demo
    figs = _figures((where / "report.html").read_text())
    titles = [f["title"] for f in figs]
    assert titles[0].startswith("Monte-Carlo: saturating (4,194,304 samples)")
    assert "Cumulative pseudo-regret of the dispatches: UCB1 + gates vs round-robin" in titles
    assert any(t.startswith("UCB1 score of the") for t in titles)
    assert any(t.startswith("Learner: blocked in next() (mean ") for t in titles)
    assert len(figs) == 4
    for f in figs:
        assert f["x"] and all(f["x"]) and f["y"] and all(f["y"]), f     # no axis without its label
        assert f["frame_width"] == FRAME_WIDTH
        assert len(f["title"]) * TITLE_PX_PER_CHAR <= f["frame_width"], f"title would be cut: {f['title']!r}"
        assert f["legend"] and not f["uncovered"], f"a series without a legend entry in {f['title']!r}"
        assert not f["inside"], f"a legend drawn over the data of {f['title']!r}"
        assert max(map(len, f["legend"])) <= LEGEND_CHARS, f["legend"]     # the plot fits 1000 px
    legend = {f["title"].split(":")[0].split(" (")[0]: f["legend"] for f in figs}
    assert any("sampled histogram" == x for x in legend["Monte-Carlo"])
    assert any(x.startswith("mean ") and "± " in x and "CI" in x for x in legend["Monte-Carlo"])
    assert any(x.startswith("output 95 % sampled") for x in legend["Monte-Carlo"])
    assert any(x.startswith("output 95 % normal") for x in legend["Monte-Carlo"])
    latency = next(f for f in figs if f["title"].startswith("Learner"))
    assert latency["legend"] == ["exposed latency (blocked in next())", "learner step compute"]
    ucb = next(f for f in figs if f["title"].startswith("UCB1 score"))
    assert len(ucb["legend"]) == 6 and all(re.fullmatch(r"[\w-]+ \(\d+ runs\)", x) for x in ucb["legend"])


@pytest.mark.timeout(300, method="thread")
def test_the_printed_replay_command_works_from_another_directory(demo, tmp_path):
    where, res, printed = demo
    line = next(ln for ln in printed.splitlines() if ln.startswith("Replay shard 17 alone: "))
    command = line.split(": ", 1)[1]
    assert command == res.replay_command and f"--store {where / STORE_NAME}" in command
    assert os.path.isdir(res.store) and f"Store:  {res.store}" in printed
    argv = shlex.split(command)
    exe = shutil.which(argv[0])
    argv = [exe] + argv[1:] if exe else [sys.executable, "-m", "dask_research.cli"] + argv[1:]
    out = subprocess.run(argv, cwd=tmp_path, env=os.environ.copy(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"run {res.montecarlo.run_id[:12]} shard 17: recomputed alone, identical" in out.stdout


def test_a_bad_out_path_is_refused_before_anything_runs(tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the demo started before checking --out")

    monkeypatch.setattr(demo_module, "_montecarlo", never)
    monkeypatch.setattr("distributed.LocalCluster", never)
    with pytest.raises(InputError, match="does not exist"):
        run_demo(out=str(tmp_path / "no" / "such" / "r.html"), quick=True)
    with pytest.raises(InputError, match="not a directory"):
        run_demo(out=str(tmp_path), quick=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        run_demo(out=str(tmp_path / "r.html"), quick=True, store=str(tmp_path / "file"))
    with pytest.raises(InputError, match="is a file"):
        check_store_path(str(tmp_path / "file" / "sub"))
    assert check_out_path(str(tmp_path / "r.html")) == str(tmp_path / "r.html")
    assert not (tmp_path / STORE_NAME).exists() and not (tmp_path / "r.html").exists()


def test_demo_command_help():
    out = CliRunner().invoke(main, ["demo", "--help"])
    assert out.exit_code == 0 and "HTML report" in out.output


from dask_research.testing.browser import headless_chrome, missing  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
@pytest.mark.timeout(180, method="thread")
def test_the_report_renders_in_a_browser_within_1000_pixels(demo, tmp_path):
    """Opened offline in headless chromium: every plot draws, nothing errs, nothing overflows sideways."""
    PIL = pytest.importorskip("PIL.Image")

    where, _, _ = demo
    with headless_chrome(1000, 4000) as driver:
        driver.get((where / "report.html").as_uri())
        colors = ["#4c72b0", "#c44e52", "#8c8c8c", "#55a868"]       # histogram, normal/latency, round-robin, band
        deadline = time.monotonic() + 60
        while True:
            driver.save_screenshot(str(tmp_path / "report.png"))
            rgb = np.asarray(PIL.open(tmp_path / "report.png").convert("RGB")).reshape(-1, 3).astype(int)
            drawn = [c for c in colors if (np.abs(rgb - [int(c[i:i + 2], 16) for i in (1, 3, 5)]).max(axis=1) <= 40)
                     .sum() >= 50]
            if len(drawn) == len(colors) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert drawn == colors, f"plots not drawn: missing {set(colors) - set(drawn)}"
        width = driver.execute_script("return document.documentElement.scrollWidth")
        inner = driver.execute_script("return window.innerWidth")
        assert width <= inner, f"the report is {width} px wide in a {inner} px window"
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors




def test_a_short_pilot_plan_reads_as_english():
    """The notebook's pilot plan said "about 0.0 s on 2 threads"."""
    import dataclasses

    from dask_research.montecarlo.pilot import Plan

    plan = Plan(target_stderr=1e-3, sigma=0.3, samples_per_shard=4096, shards=4, threads=1,
                shard_seconds=0.003, est_seconds=0.012)
    assert "about 0.012 s on 1 thread " in str(plan)
    assert "about 12.3 s on 2 threads" in str(dataclasses.replace(plan, est_seconds=12.34, threads=2))


def test_the_histogram_shows_the_data_not_the_frozen_range_margin():
    """The demo's histogram spanned the frozen range 0.08-1.05 while the outputs lay in
    0.32-0.83 (40 % of the width empty); the x range now ends a few % past the data."""
    import types

    from dask_research.html_report import montecarlo_figure

    edges = np.linspace(0.08, 1.05, 257)
    mid = (edges[:-1] + edges[1:]) / 2
    counts = np.where((mid > 0.32) & (mid < 0.83), np.exp(-((mid - 0.58) / 0.08) ** 2 / 2) * 1e4 + 1, 0)
    iv = types.SimpleNamespace(percentile=(0.43, 0.74), normal=(0.43, 0.74))
    fake = types.SimpleNamespace(
        histogram=(edges, counts), n=int(counts.sum()), name="saturating", run_id="0" * 12,
        interval=lambda level: iv, quantile=lambda q: (0.33, 0.82), mean=0.584,
        mean_interval=lambda level: (0.5839, 0.5841), stderr=0.0001 / 1.96,
        linearized=types.SimpleNamespace(value=0.591, sd=0.082))
    fig = montecarlo_figure(fake).children[0]
    start, end = fig.x_range.start, fig.x_range.end
    assert 0.30 <= start < 0.33 and 0.82 < end <= 0.85, (start, end)


def test_the_ucb_score_plot_draws_each_branch_from_its_first_result_as_steps(demo):
    """Each line starts when its branch has a result (a score before then is a bonus over no
    data, drawn as a vertical line from 0), and holds until the next selection (steps, not a
    straight line across the start-up)."""
    from bokeh.models import Step

    _, res, _ = demo
    report = res.experiments
    first_result = {}
    for e in report.events:
        if e.kind == "result" and e.branch is not None:
            first_result.setdefault(e.branch, e.t)
    scores = demo_module._experiments_figures(report).children[1]
    lines = [r for r in scores.renderers if hasattr(r, "glyph")]
    assert len(lines) == 6 and all(isinstance(r.glyph, Step) and r.glyph.mode == "after" for r in lines)
    for r in lines:
        branch = r.name or next(item.label["value"] for item in scores.legend[0].items
                                if r in item.renderers).split(" (")[0]
        x, y = list(r.data_source.data["x"]), list(r.data_source.data["y"])
        assert x and len(x) == len(y), branch
        assert x == sorted(x) and min(x) >= first_result[branch], (branch, x[:3], first_result[branch])
        assert all(math.isfinite(v) and v > 0 for v in y), (branch, y[:5])
