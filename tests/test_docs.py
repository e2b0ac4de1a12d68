"""The documentation builds without a single warning (offline, as in CI)."""
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.slow
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


@pytest.mark.parametrize("page", ["reliability.rst", "security.rst"])
def test_every_test_a_promise_page_cites_exists(page):
    """The promises of reliability.rst and security.rst name their tests: each named file and
    test function must exist (a renamed or deleted test would leave a promise untested)."""
    import re

    tests = DOCS.parent / "tests"
    text = (DOCS / page).read_text()
    files = {p.name: p for p in tests.rglob("*.py")}
    cited = re.findall(r"``((?:tests/)?[\w/]*test_\w+\.py)(?:::(\w+))?``", text)
    assert len(cited) > 20, "the page cites its tests"
    missing = []
    for path, name in cited:
        file = (DOCS.parent / path) if path.startswith("tests/") else files.get(path.split("/")[-1])
        if file is None or not file.exists():
            missing.append(path)
        elif name and not re.search(rf"^(?:async )?def {name}\(", file.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"{page} cites tests that do not exist: {missing}"


#: Files a page tells the reader to create (not in the repository).
READER_FILES = {"first_job.py"}


def test_every_file_a_page_names_exists():
    """A module, script or notebook named on a page or in the README is in the repository
    (replay.rst's module table named ``plane.py`` and ``delivery.py`` after they had become
    ``experience_plane.py`` and ``local_delivery.py``). A bare name matches a file of that name
    anywhere in the repository; a path must match the end of one."""
    import re

    root = DOCS.parent
    known = {str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".py", ".ipynb", ".sh")
             and ".git" not in p.parts and "_build" not in p.parts}
    missing = []
    for page in [root / "README.md", *sorted(DOCS.glob("*.rst"))]:
        text = page.read_text()
        for m in re.finditer(r"(?<![\w/.~-])([\w/.-]*\w\.(?:py|ipynb|sh))\b", text):
            name = m.group(1).removeprefix("./")
            if name in READER_FILES or "://" in name:
                continue
            if not any(f == name or f.endswith("/" + name) for f in known):
                missing.append(f"{page.name}:{text[:m.start()].count(chr(10)) + 1}: {name}")
    assert not missing, "pages name files that do not exist:\n" + "\n".join(missing)
