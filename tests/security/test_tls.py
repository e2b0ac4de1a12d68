"""Every capability runs on a TLS-secured cluster; a client without the certificate is refused."""
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.security import Security

pytest.importorskip("cryptography")

from dask_research import montecarlo as mc  # noqa: E402


@pytest.fixture
def tls_cluster(loop):
    import dask_research.dashboard  # noqa: F401  (the preload's pages on this scheduler)

    sec = Security.temporary()
    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False, protocol="tls://",
                      security=sec, dashboard_address=":0") as cl, \
            Client(cl, security=sec, set_as_default=False) as c:
        yield cl, c, sec, loop


def test_montecarlo_on_tls(tls_cluster):
    cl, c, _, _ = tls_cluster
    assert cl.scheduler_address.startswith("tls://")
    job = mc.Job(lambda a: np.cos(a), {"a": mc.Normal(0, 1)}, shards=8, samples_per_shard=512, seed=4, bins=16)
    res = mc.run(job, client=c, verify=2, progress=False)
    assert res.n == 8 * 512 and res.verification["mismatches"] == []
    events = c.get_events("research.montecarlo")
    assert [m["event"] for _, m in events][0] == "start" and events[-1][1]["event"] == "done"
    from dask_research.dashboard.components import ShardBoard

    board = ShardBoard(cl.scheduler)
    board.update()
    assert set(board.source.data["state"]) <= {"accepted", "verified"}


def test_a_client_without_the_certificate_cannot_connect(tls_cluster):
    cl, _, _, loop = tls_cluster
    with pytest.raises((OSError, TypeError, ValueError)):
        Client(cl.scheduler_address, timeout="2s", set_as_default=False, loop=loop)
    other = Security.temporary()  # a certificate from another authority
    with pytest.raises(OSError):
        Client(cl.scheduler_address, security=other, timeout="2s", set_as_default=False, loop=loop)


def test_experiments_on_tls(tls_cluster):
    from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner

    cl, c, _, _ = tls_cluster
    runner = make_deterministic_runner({"a": 0.9, "b": 0.1}, delay_ms=1)
    sched = IterationScheduler(runner, slots=2, client=c, progress=False)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(4) for b in "ab"])
    report = sched.run()
    assert report.paper_triggers == ["a"] and report.total_runs >= 4
    kinds = {r["event"] for _, m in c.get_events("research.experiments") for r in m["events"]}
    assert {"select", "dispatch", "result", "paper.trigger"} <= kinds


def test_replay_stats_on_tls(tls_cluster):
    from dask_research import replay
    from dask_research.dashboard.components import ExperiencePanel
    from dask_research.dashboard.publish import publish_plane

    cl, c, _, _ = tls_cluster
    plane = replay.ExperiencePlane({"x": ((2,), "float32")}, capacity=1024)
    plane.ingest({"x": np.ones((100, 2), np.float32)})
    pub = publish_plane(plane, c, interval=0.05, name="tls-plane")
    plane.sample(32)
    pub.stop()
    panel = ExperiencePanel(cl.scheduler)
    panel.update()
    assert "tls-plane" in panel.summary.text and "100 transitions" in panel.summary.text
