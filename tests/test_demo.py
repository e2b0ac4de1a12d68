"""The README's main job: `dask-research demo` runs all three capabilities and writes a report."""
import re

import pytest
from click.testing import CliRunner

pytest.importorskip("bokeh")

from dask_research.cli import main  # noqa: E402
from dask_research.demo import BRANCH_MEANS, run_demo  # noqa: E402


def test_demo_runs_everything_and_writes_a_self_contained_report(tmp_path, capsys):
    out = tmp_path / "report.html"
    res = run_demo(out=str(out), quick=True)
    html = out.read_text()
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
    printed = capsys.readouterr().out
    assert "Dashboard:" in printed and "individual-research-shards" in printed and "Report:" in printed


def test_demo_command_help():
    out = CliRunner().invoke(main, ["demo", "--help"])
    assert out.exit_code == 0 and "HTML report" in out.output
