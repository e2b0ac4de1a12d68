"""write_report writes through the durable layer: atomic replace, no links, no special files."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("bokeh")

from dask_research.exceptions import ReportError  # noqa: E402
from dask_research.html_report import write_report  # noqa: E402
from dask_research.testing.threads import in_thread  # noqa: E402


def test_a_report_replaces_the_old_one_whole(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old")
    assert write_report(str(path), "T", ["<p>firstsection</p>"]) == str(path)
    text = path.read_text()
    assert "firstsection" in text and text.rstrip().endswith("</html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]     # no temporary left


def test_a_report_path_that_is_a_link_or_a_fifo_is_refused_and_nothing_behind_it_changes(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    (tmp_path / "r.html").symlink_to(victim)
    with pytest.raises(ReportError, match="r.html: is a symbolic link"):
        write_report(str(tmp_path / "r.html"), "T", ["x"])
    assert victim.read_text() == "mine"
    os.mkfifo(tmp_path / "f.html")
    t, out = in_thread(lambda: write_report(str(tmp_path / "f.html"), "T", ["x"]), join=120)
    assert not t.is_alive() and isinstance(out.get("error"), ReportError)
    assert "not a regular file" in str(out["error"])
