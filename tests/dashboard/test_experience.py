import time

import numpy as np
import pytest

pytest.importorskip("bokeh")

from dask_research import replay  # noqa: E402
from dask_research.dashboard.components import ExperiencePanel, plane_series  # noqa: E402
from dask_research.dashboard.publish import publish_plane  # noqa: E402

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}


def _batch(n, rng):
    return {"obs": rng.random((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n),
            "reward": rng.random(n, dtype=np.float32)}




def test_experience_panel_on_a_real_plane(small_cluster):
    cl, c = small_cluster
    rng = np.random.default_rng(0)
    plane = replay.ExperiencePlane(SPEC, capacity=4096)
    panel = ExperiencePanel(cl.scheduler)
    panel.update()
    assert "No experience plane" in panel.summary.text
    pub = publish_plane(plane, c, interval=0.05, name="learner-<0>")
    plane.ingest(_batch(256, rng))
    it = plane.batches(batch_size=32, prefetch=2)
    for i in range(6):
        if i:
            plane.ingest(_batch(256, rng))
        for _ in range(8):
            next(it)
        time.sleep(0.06)
    it.close()
    pub.stop()
    assert pub.sent >= 3
    panel.update()
    data = panel.source.data
    assert len(data["t"]) == pub.sent and max(data["ingest_rate"]) > 0 and max(data["sample_rate"]) > 0
    assert panel.tiers.data["used"] == [min(6 * 256, 4096)]
    assert "learner-&lt;0&gt;" in panel.summary.text and "1,536 transitions" in panel.summary.text


def test_series_rates_from_counters():
    ev = [(0, {"event": "stats", "plane": "p", "t": 10.0, "size": 0, "capacity": 9, "inserted": 0, "sampled": 0,
               "tiers": [], "exposed_mean_s": 0.0, "step_mean_s": 0.0}),
          (1, {"event": "stats", "plane": "p", "t": 12.0, "size": 9, "capacity": 9, "inserted": 100, "sampled": 400,
               "tiers": [{"name": "host", "used": 9, "rows": 9}], "exposed_mean_s": 0.001, "step_mean_s": 0.01})]
    s = plane_series(ev)["p"]
    assert s["ingest_rate"] == [0.0, 50.0] and s["sample_rate"] == [0.0, 200.0]
    assert s["exposed_pct"][-1] == pytest.approx(10.0)
