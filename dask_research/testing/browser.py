"""A headless Chromium for tests that look at what a page shows (Debian's chromium and driver).

Examples
--------
>>> from dask_research.testing.browser import missing
>>> isinstance(missing(), (str, type(None)))       # why no browser test can run here, or None
True
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["CHROMIUM", "CHROMEDRIVER", "missing", "headless_chrome"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

#: Flags for a root user on a machine whose network reaches nothing but localhost.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")


def missing() -> str | None:
    """Why a browser test cannot run here (a skip reason), or ``None``."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (pip install -e '.[test]')"
    return None


@contextlib.contextmanager
def headless_chrome(width: int = 1200, height: int = 900) -> Iterator[Any]:
    """A selenium driver of a fresh headless Chromium profile, with the browser log kept."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        raise RuntimeError(missing())
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in FLAGS + (f"--window-size={width},{height}",):
        opts.add_argument(flag)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
