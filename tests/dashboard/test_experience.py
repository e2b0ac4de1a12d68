import time

import dask
import numpy as np
import pytest

pytest.importorskip("bokeh")

from dask_research import replay  # noqa: E402
from dask_research.dashboard.components import ExperiencePanel  # noqa: E402
from dask_research.dashboard.folds import plane_series  # noqa: E402
from dask_research.exceptions import InputError  # noqa: E402
from dask_research.replay import publish_plane  # noqa: E402

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


def test_the_last_event_of_a_run_draws_no_rate_spike():
    """A plane publishes once more when it closes, milliseconds after its last periodic event:
    255 transitions in 18 ms drew 14,000/s on a run of 500/s (and a sample rate of 0), seen on
    the page after examples/dqn_cartpole.py. A rate is taken over at least half the usual
    interval."""
    counts = [(t, 500 * t, 9000 * t) for t in range(6)] + [(5.018, 2509, 45000)]
    ev = [(i, {"event": "stats", "plane": "p", "t": 100.0 + t, "size": n, "capacity": 10**6, "inserted": n,
               "sampled": m, "tiers": [], "exposed_mean_s": 0.0}) for i, (t, n, m) in enumerate(counts)]
    s = plane_series(ev)["p"]
    assert s["ingest_rate"][1:] == pytest.approx([500.0] * 5 + [509 / 1.018])
    assert s["sample_rate"][1:] == pytest.approx([9000.0] * 5 + [9000 / 1.018])      # not 0


def test_malformed_stats_are_skipped_with_one_warning(caplog):
    """Replay ``stats`` fields were read unchecked: a string or a missing field failed the page."""
    import logging

    good = {"event": "stats", "plane": "p", "t": 12.0, "size": 9, "inserted": 100, "sampled": 400,
            "tiers": [{"name": "host", "used": 9, "rows": 9}], "exposed_mean_s": 0.001, "step_mean_s": 0.01}
    bad = [dict(good, size="nine"), {k: v for k, v in good.items() if k != "t"}, dict(good, tiers="host"),
           dict(good, exposed_mean_s=float("nan"))]
    with caplog.at_level(logging.WARNING, logger="dask_research.dashboard.folds"):
        s = plane_series([(0, b) for b in bad] + [(1, good)])["p"]
    assert s["size"] == [9]
    assert len([r for r in caplog.records if "skipped an event" in r.getMessage()]) == len(bad)


def _stats_events(client, name):
    return [m for _, m in client.get_events("research.replay")
            if m.get("event") == "stats" and m.get("plane") == name]


@pytest.mark.timeout(120, method="thread")
def test_a_plane_given_a_client_publishes_by_itself(small_cluster):
    cl, c = small_cluster
    rng = np.random.default_rng(0)
    plane = replay.ExperiencePlane(SPEC, capacity=4096, client=c, name="tour",
                                   publish_interval=0.05)
    plane.ingest(_batch(512, rng))
    with plane.batches(batch_size=32, prefetch=2, max_batches=20) as it:
        for _ in it:
            pass
    from dask_research.testing.processes import wait_for

    wait_for(lambda: len(_stats_events(c, "tour")) >= 3, 30, "three stats events")
    plane.close()                                    # publishes the last figures and stops
    n = len(_stats_events(c, "tour"))
    assert _stats_events(c, "tour")[-1]["size"] == 512
    time.sleep(0.3)
    assert len(_stats_events(c, "tour")) == n        # stopped with the plane
    panel = ExperiencePanel(cl.scheduler)
    panel.update()
    assert "<b>tour</b>: 512 transitions stored" in panel.summary.text
    assert "last update " in panel.summary.text and " s ago)" in panel.summary.text
    quiet = replay.ExperiencePlane(SPEC, capacity=16, client=c, name="quiet", publish_interval=0)
    with dask.config.set({"research.replay.publish-interval": None}):
        silent = replay.ExperiencePlane(SPEC, capacity=16, client=c, name="silent")
    assert quiet._publisher is None and silent._publisher is None
    quiet.close()
    silent.close()
    with pytest.raises(InputError, match=r"plane 'bad': publish_interval=-1 is invalid"):
        replay.ExperiencePlane(SPEC, capacity=16, client=c, name="bad", publish_interval=-1)


@pytest.mark.timeout(180, method="thread")
def test_a_cluster_plane_feeds_the_experience_page(loop):
    from distributed import Client, LocalCluster

    from dask_research.testing.processes import wait_for

    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        with dask.config.set({"research.replay.publish-interval": 0.05}):
            plane = replay.ClusterPlane(SPEC, client=c, capacity_per_worker=2048, name="dqn-like", seed=0)
        rng = np.random.default_rng(1)
        for w in sorted(c.scheduler_info()["workers"]):
            plane.ingest(_batch(300, rng), worker=w)
        with plane.batches(batch_size=32, prefetch=2, max_batches=30) as it:
            for _ in it:
                pass
        wait_for(lambda: any(e["size"] == 600 and e["batches"] == 30
                             for e in _stats_events(c, "dqn-like")), 30, "a stats event with the batches")
        panel = ExperiencePanel(cl.scheduler)
        panel.update()
        text = panel.summary.text
        assert "<b>dqn-like</b>: 600 transitions stored" in text and "last update " in text
        used = panel.tiers.data["used"]
        assert used == [300, 300] and all(t.startswith("shard ") for t in panel.tiers.data["tier"])
        assert max(panel.source.data["sample_rate"]) > 0
        plane.close(drop=True)
        n = len(_stats_events(c, "dqn-like"))
        time.sleep(0.3)
        assert len(_stats_events(c, "dqn-like")) == n


def test_freshness_says_when_the_page_went_stale():
    from dask_research.dashboard.components import freshness

    t = time.mktime((2026, 12, 1, 9, 5, 7, 0, 0, -1))
    assert freshness(t, now=t + 2.4, interval=1.0) == "last update 09:05:07 (2 s ago)"
    assert freshness(t, now=t + 9, interval=1.0) == "last update 09:05:07 (9 s ago)"
    assert freshness(t, now=t + 31, interval=1.0).endswith("(31 s ago; stale: the plane has stopped publishing)")
    assert "stale" not in freshness(t, now=t + 31, interval=30.0)


@pytest.mark.slow
@pytest.mark.timeout(240, method="thread")
def test_the_cluster_dqn_run_feeds_the_experience_page(loop):
    """The path of examples/dqn_cartpole.py (train_dqn on a cluster plane) publishes stats."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("torch")
    from distributed import Client, LocalCluster

    from dask_research.replay.rl import DQNConfig, train_dqn

    with dask.config.set({"research.replay.publish-interval": 0.1}), \
            LocalCluster(loop=loop, n_workers=1, threads_per_worker=2, processes=False,
                         dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        result = train_dqn(c, DQNConfig(max_env_steps=3000, seed=0, max_seconds=60))
        name = result.plane_stats["name"]
        events = _stats_events(c, name)
        assert events and events[-1]["inserted"] > 0
        panel = ExperiencePanel(cl.scheduler)
        panel.update()
        assert f"<b>{name}</b>" in panel.summary.text and "last update" in panel.summary.text
