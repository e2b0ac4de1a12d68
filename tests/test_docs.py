"""The documentation builds without a single warning (offline, as in CI)."""
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def test_docs_build_without_warnings(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
                          "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    html = (tmp_path / "html" / "configuration-reference.html").read_text()
    assert "research.montecarlo" in html and "speculate" in html   # generated from the schema
    for page in ("montecarlo", "experiments", "replay", "deployment", "scaling", "security", "reliability", "api"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page
    footer = (tmp_path / "html" / "getting-started.html").read_text().split('<div class="footer">')[1][:300]
    assert "&#169;." not in footer and "©." not in footer, footer
    assert "dask-research developers" in footer, footer


def test_static_pages_load_nothing_from_the_network():
    """An air-gapped login node shows them: every script and stylesheet is inline."""
    import re

    for page in sorted((DOCS / "_static").glob("*.html")):
        text = page.read_text()
        remote = re.findall(r"""<(?:script|link)[^>]+(?:src|href)=["'](?:https?:)?//[^"']+""", text)
        assert not remote, f"{page.name} loads {remote[:2]}"
        assert "Bokeh" in text or "bokeh" in text
