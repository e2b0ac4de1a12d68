"""Every capability runs on a TLS-secured cluster; a client without the certificate is refused."""
import os
import pathlib
import subprocess
import sys

import dask
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


JOB = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "saturating_pipeline.py") + ":job"


def _tls_config(sec: Security) -> dict:
    """The Dask configuration that gives a client ``sec``'s certificate (what a user sets)."""
    return {"distributed.comm.tls.ca-file": sec.tls_ca_file,
            "distributed.comm.tls.client.cert": sec.tls_client_cert,
            "distributed.comm.tls.client.key": sec.tls_client_key}


def _plan_on(address: str) -> tuple[int, str]:
    """``dask-research mc pilot JOB --target-stderr 0.01 --scheduler ADDRESS``: its exit code, output."""
    from click.testing import CliRunner

    from dask_research import cli

    r = CliRunner().invoke(cli.main, ["mc", "pilot", JOB, "--target-stderr", "0.01", "--scheduler", address])
    return r.exit_code, r.output


def test_the_cli_without_a_certificate_says_which_settings_give_one(tls_cluster):
    cl, _, _, _ = tls_cluster
    code, out = _plan_on(cl.scheduler_address)
    last = out.strip().splitlines()[-1]
    assert code == 1, out
    assert last.startswith(f"Error: cannot reach the scheduler at {cl.scheduler_address}: it speaks TLS")
    assert "distributed.comm.tls.ca-file" in last and "distributed.comm.tls.client.key" in last
    assert "TypeError" not in out and "Traceback" not in out


def test_a_certificate_from_another_authority_is_refused_in_one_line(tls_cluster, tmp_path):
    cl, _, _, loop = tls_cluster
    other = Security.temporary()                     # a certificate from another authority
    # In a process of its own, as a user runs it, with the certificate in files named by the
    # environment (Dask's client leaves its loop thread behind when its connection fails).
    env = dict(os.environ)
    for key, pem in _tls_config(other).items():
        f = tmp_path / (key.replace(".", "_") + ".pem")
        f.write_text(pem)
        env["DASK_" + key.upper().replace(".", "__").replace("-", "_")] = str(f)
    r = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "pilot", JOB, "--target-stderr", "0.01",
                        "--scheduler", cl.scheduler_address], env=env, capture_output=True, text=True, timeout=120)
    code, out = r.returncode, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert code == 1, out
    assert last.startswith(f"Error: cannot reach the scheduler at {cl.scheduler_address}: ")
    assert "TLS certificate does not match" in last and "Traceback" not in out, out
    # A Python session gets Dask's own connection error, an OSError that names the cause.
    with pytest.raises(OSError, match="certificate"):
        Client(cl.scheduler_address, security=other, timeout="10s", set_as_default=False, loop=loop)


def test_the_cli_with_the_clusters_certificate_plans_on_it(tls_cluster):
    cl, _, sec, _ = tls_cluster
    with dask.config.set(_tls_config(sec)):
        code, out = _plan_on(cl.scheduler_address)
    assert code == 0, out
    assert "target stderr 0.01" in out and "on 2 threads" in out     # the cluster's 2 workers x 1 thread


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
    from dask_research.replay import publish_plane

    cl, c, _, _ = tls_cluster
    plane = replay.ExperiencePlane({"x": ((2,), "float32")}, capacity=1024)
    plane.ingest({"x": np.ones((100, 2), np.float32)})
    pub = publish_plane(plane, c, interval=0.05, name="tls-plane")
    plane.sample(32)
    pub.stop()
    panel = ExperiencePanel(cl.scheduler)
    panel.update()
    assert "tls-plane" in panel.summary.text and "100 transitions" in panel.summary.text
