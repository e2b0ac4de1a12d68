"""The research pages in a real headless browser (Debian's chromium): they render data."""
import time

import numpy as np
import pytest

pytest.importorskip("bokeh")
PIL = pytest.importorskip("PIL.Image")

from dask_research import montecarlo as mc  # noqa: E402

webdriver = pytest.importorskip("selenium.webdriver")

from dask_research.testing.browser import headless_chrome, missing  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture
def browser():
    with headless_chrome(1200, 900) as driver:
        yield driver


def wait_for_colors(driver, path: str, colors: list[str], timeout: float = 20.0):
    """Screenshot until every color is drawn (Bokeh renders after its websocket syncs)."""
    deadline = time.monotonic() + timeout
    while True:
        driver.save_screenshot(path)
        img = PIL.open(path)
        if all(_has_color(img, c) for c in colors) or time.monotonic() > deadline:
            return img
        time.sleep(0.5)


def _has_color(img, hex_color: str, tol: int = 12, min_pixels: int = 50) -> bool:
    rgb = np.asarray(img.convert("RGB")).reshape(-1, 3).astype(int)
    target = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - target).max(axis=1) <= tol).sum()) >= min_pixels


def test_shards_page_renders_the_run(dashboard_cluster, browser, tmp_path):
    cl, c = dashboard_cluster
    job = mc.Job(lambda a: np.sin(a), {"a": mc.Normal(0, 1)}, shards=64, samples_per_shard=256, seed=8, bins=16,
                 name="<b>sine</b>")
    res = mc.run(job, client=c, verify=4, progress=False)
    base = f"http://127.0.0.1:{cl.scheduler.http_server.port}"
    from dask_research.dashboard.components import STATE_COLORS

    browser.get(f"{base}/individual-research-shards")
    img = wait_for_colors(browser, str(tmp_path / "shards.png"), [STATE_COLORS[2], STATE_COLORS[3]])
    assert _has_color(img, STATE_COLORS[2]), "no accepted shards drawn"   # glyphs present
    assert _has_color(img, STATE_COLORS[3]), "no verified shards drawn"
    text = browser.find_element("tag name", "body").get_attribute("innerText") or ""
    shadow = browser.execute_script(
        "const out = []; const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);"
        " for (const c of n.children || []) walk(c); if (n.innerText) out.push(n.innerText); };"
        " walk(document.body); return out.join(' ');")
    assert res.run_id[:12] in text + shadow
    assert "<b>sine</b>" in text + shadow           # the user's name is shown as text, not markup
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
    # and the page is listed in the dashboard's "More..." menu
    import urllib.request

    status = urllib.request.urlopen(f"{base}/status", timeout=10).read().decode()
    assert "individual-research-shards" in status


@pytest.mark.slow
def test_experience_page_renders_published_stats(dashboard_cluster, browser, tmp_path):
    from dask_research import replay
    from dask_research.replay import publish_plane

    cl, c = dashboard_cluster
    plane = replay.ExperiencePlane({"obs": ((4,), "float32"), "reward": ((), "float32")}, capacity=2048)
    rng = np.random.default_rng(1)
    pub = publish_plane(plane, c, interval=0.05, name="learner")
    for _ in range(5):
        plane.ingest({"obs": rng.random((256, 4), dtype=np.float32), "reward": rng.random(256, dtype=np.float32)})
        plane.sample(64)
        time.sleep(0.08)
    pub.stop()
    browser.get(f"http://127.0.0.1:{cl.scheduler.http_server.port}/individual-research-experience")
    img = wait_for_colors(browser, str(tmp_path / "experience.png"), ["#55a868", "#4c72b0"])
    assert _has_color(img, "#55a868"), "no tier occupancy bar drawn"
    assert _has_color(img, "#4c72b0", min_pixels=20), "no ingest-rate line drawn"
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.slow
def test_branches_page_renders_a_run(dashboard_cluster, browser, tmp_path):
    from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner

    cl, c = dashboard_cluster
    runner = make_deterministic_runner({"good": 0.9, "mid": 0.5, "bad": 0.05}, delay_ms=2)
    sched = IterationScheduler(runner, slots=2, progress=False, client=c)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(5) for b in ("good", "mid", "bad")])
    sched.run()
    browser.get(f"http://127.0.0.1:{cl.scheduler.http_server.port}/individual-research-branches")
    img = wait_for_colors(browser, str(tmp_path / "branches.png"), ["#ccb974", "#c44e52", "#4c72b0"])
    for color in ("#ccb974", "#c44e52", "#4c72b0"):   # paper, pruned, active bars
        assert _has_color(img, color), color
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
