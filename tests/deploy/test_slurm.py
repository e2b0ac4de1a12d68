"""dask-research on a real SLURM through dask-jobqueue (``dask_research.testing.slurm``).

Worker processes are SLURM batch jobs: ``SLURMCluster(cores=1, memory="2GB", queue=...)``.
Each test is small; the fixture skips (with the reason) where SLURM cannot run.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research._cluster import workers_info
from dask_research.testing.pipelines import slow_tanh  # importable by the worker jobs
from dask_research.testing.processes import wait_for
from dask_research.testing.threads import in_thread

from .conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@contextlib.contextmanager
def slurm_client(slurm, jobs=2):
    """A ``SLURMCluster`` of ``jobs`` one-core jobs and its client, once every worker is up."""
    from dask_jobqueue import SLURMCluster

    with SLURMCluster(cores=1, memory="2GB", queue=slurm.partition, walltime="00:20:00",
                      scheduler_options={"host": "127.0.0.1", "dashboard_address": None}) as cluster, \
            Client(cluster, set_as_default=False) as client:
        cluster.scale(jobs=jobs)
        client.wait_for_workers(jobs, timeout=120)
        yield cluster, client
    wait_for(lambda: not slurm.jobs(), 60, "the worker jobs to leave the queue")


def _job(shards=16, delay=0.0):
    """A small job whose pipeline the worker jobs can import (dask_research.testing)."""
    return mc.Job(functools.partial(slow_tanh, delay=delay), {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)},
                  shards=shards, samples_per_shard=1024, seed=5, bins=32, range=(0.0, 1.0))


def _embedded(job):
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        return mc.run(job, client=c, verify=0, progress=False)


def _worker_jobs(slurm) -> list[str]:
    return [j["id"] for j in slurm.jobs("RUNNING")]


@pytest.mark.timeout(300, method="thread")
def test_montecarlo_on_slurmcluster_is_bit_identical_to_the_embedded_run(slurm):
    job = _job()
    with slurm_client(slurm) as (cluster, client):
        assert len(_worker_jobs(slurm)) == 2
        res = mc.run(job, client=client, verify=2, progress=False)
        assert len(res.workers) == 2
        assert all(not c["same_worker"] for c in res.verification["checked"])
    assert res.state == _embedded(job).state


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_scancel_of_a_worker_job_mid_run_loses_nothing_and_changes_no_bit(slurm, tmp_path):
    job = _job(shards=48, delay=0.2)     # about 5 s on two workers: the cancel lands mid-run
    store = tmp_path / "store"
    with slurm_client(slurm) as (cluster, client):
        t, out = in_thread(lambda: mc.run(job, client=client, store=str(store), verify=2, progress=False,
                                          shards_per_task=2))
        try:
            wait_for(lambda: "error" in out or _stored(store, job) >= 12, 120, "a quarter of the shards")
            assert "error" not in out, out.get("error")
            victim = _worker_jobs(slurm)[0]
            assert slurm.run("scancel", victim).returncode == 0
            wait_for(lambda: victim not in _worker_jobs(slurm), 60, f"job {victim} to end")
            assert t.is_alive() and _stored(store, job) < 48        # the job ended mid-run
        finally:
            t.join(timeout=180)
        assert "error" not in out, out.get("error")
        assert len(workers_info(client)) == 1
    res = out["result"]
    stored = mc.RunStore(str(store)).read_shards(job.id)
    # The cancelled job had done shards: its worker wrote shard files before it went. (Blocks it
    # finished whose group had not reached the client yet were recomputed elsewhere, with the
    # same bits: the survivor's write of the same file found the same states.)
    assert len({worker for _, worker, _ in stored.values()}) == 2, {w for _, w, _ in stored.values()}
    assert res.state == _embedded(job).state                          # bit-identical
    assert res.n == 48 * 1024 and int(res.state.hist.sum()) == res.n   # nothing lost, nothing twice
    assert sorted(stored) == list(range(48))


def _stored(store, job) -> int:
    d = store / "runs" / job.id / "shards"
    return len(mc.RunStore(str(store)).read_shards(job.id)) if d.exists() else 0


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_iteration_scheduler_with_a_client_on_slurm(slurm):
    from dask_research.experiments import Hypothesis, IterationScheduler, make_deterministic_runner

    def scheduler(client):
        runner = make_deterministic_runner({"a": 0.8, "b": 0.5, "c": 0.2}, delay_ms=20)
        # Decisions in dispatch order: the same whatever order the two SLURM workers finish in
        # (with completion order, two 20 ms experiments racing decide the fourth pick).
        sched = IterationScheduler(runner, slots=2, client=client, progress=False, max_experiments=12,
                                   apply_order="dispatch")
        sched.add([Hypothesis(f"{x}{k}", x) for k in range(6) for x in "abc"])
        return sched

    with slurm_client(slurm) as (cluster, client):
        report = scheduler(client).run()
        ran_on = client.run(os.getpid)
        assert len(ran_on) == 2
    local = scheduler(None).run()
    assert report.total_runs == 12 == local.total_runs and not report.failed
    assert [e.hypothesis for e in report.events.of("select")] == [e.hypothesis for e in local.events.of("select")]


CARTPOLE = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
            "next_obs": ((4,), "float32"), "done": ((), "bool")}


def _batch(n, start=0):
    idx = np.arange(start, start + n)
    return {"obs": np.stack([idx] * 4, axis=1).astype("float32"), "action": (idx % 2).astype("int64"),
            "reward": np.ones(n, "float32"), "next_obs": np.stack([idx + 1] * 4, axis=1).astype("float32"),
            "done": (idx % 50 == 49)}


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_replay_plane_recovers_a_cancelled_worker_jobs_shard_from_its_checkpoint(slurm, tmp_path):
    from dask_research import replay

    with dask.config.set({"research.replay.cluster.refresh-interval": 0.2,
                          "distributed.deploy.lost-worker-timeout": "1s"}), \
            slurm_client(slurm) as (cluster, client):
        plane = replay.ClusterPlane(CARTPOLE, client=client, capacity_per_worker=10_000, seed=3,
                                    checkpoint_dir=tmp_path / "ckpt")
        try:
            addresses = sorted(workers_info(client))
            for a in addresses:
                plane.ingest(_batch(2000), worker=a)
            metas = plane.checkpoint()
            assert sorted(m["size"] for m in metas.values()) == [2000, 2000]
            plane.ingest(_batch(300, start=2000), worker=addresses[0])       # never checkpointed
            victim = _job_of_worker(client, addresses[0])
            assert slurm.run("scancel", victim).returncode == 0
            wait_for(lambda: (plane.refresh() or True) and any(r.lost for r in plane.shards), 60,
                     "the loss to be noticed")
            lost = plane.stats()["lost_shards"]
            assert len(lost) == 1 and lost[0]["lost_size"] == 2300 and lost[0]["checkpoint"]["size"] == 2000
            # dask-jobqueue forgets the cancelled job after distributed.deploy.lost-worker-timeout;
            # then scale() submits a replacement for it.
            wait_for(lambda: len(cluster.workers) == 1, 60, "the cluster to forget the cancelled job")
            cluster.scale(jobs=2)
            wait_for(lambda: len(workers_info(client)) == 2, 120, "a replacement worker job")
            wait_for(lambda: (plane.refresh() or True) and plane.stats(refresh=False)["restored"], 60,
                     "the lost shard to be restored from its checkpoint")
            s = plane.stats()
            assert s["restored"] == 2000 and s["live_shards"] == 2 and s["size"] == 4000
        finally:
            plane.close(drop=True)


def _job_of_worker(client, address) -> str:
    """The SLURM job id a worker runs in (its environment's ``SLURM_JOB_ID``)."""
    return client.run(lambda: os.environ["SLURM_JOB_ID"], workers=[address])[address]


# -- the command line and the documented batch script ------------------------------------------
DOCS = os.path.join(REPO, "docs", "deployment.rst")


def _doc_block(caption: str) -> str:
    """The text of the ``code-block`` in docs/deployment.rst with ``:caption: CAPTION``."""
    text = open(DOCS).read()
    m = re.search(r"^\.\. code-block:: \w+\n   :caption: " + re.escape(caption) + r"\n\n((?:   .*\n|\n)+)", text, re.M)
    assert m, f"docs/deployment.rst has no code-block captioned {caption!r}"
    return "\n".join(line[3:] for line in m.group(1).rstrip().splitlines()) + "\n"


def _command(caption: str) -> list[str]:
    return shlex.split(_doc_block(caption).replace("\\\n", " "), comments=True)


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_documented_python_session_runs_on_slurm(slurm, tmp_path, monkeypatch):
    block = _doc_block("mc.run on a SLURMCluster")
    assert f'queue="{slurm.partition}"' in block
    monkeypatch.chdir(tmp_path)                      # the block's store="runs/"
    job = _job()
    namespace = {"job": job}
    try:
        exec(compile(block, "docs/deployment.rst", "exec"), namespace)
    finally:
        for name in ("client", "cluster"):
            if name in namespace:
                namespace[name].close()
    result = namespace["result"]
    assert (tmp_path / "runs" / "runs" / job.id / "result.json").exists()
    assert result.state == _embedded(job).state
    wait_for(lambda: not slurm.jobs(), 60, "the worker jobs to leave the queue")


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_documented_cli_command_runs_on_slurm(slurm, tmp_path):
    cmd = _command("mc run on SLURM")
    assert cmd[:2] == ["dask-research", "mc"] and cmd[cmd.index("--cluster") + 1] == "slurm"
    assert cmd[cmd.index("--queue") + 1] == slurm.partition
    (tmp_path / "examples").mkdir()
    shutil.copy(os.path.join(REPO, "examples", "saturating_pipeline.py"), tmp_path / "examples")
    # The documented command, plus fewer shards (a quick test) and --json (to read the result).
    extra = ["--shards", "24", "--no-progress", "--json"]
    # As on a new account: no jobqueue.slurm.log-directory (the fixture's env sets one for its own jobs).
    env = {k: v for k, v in slurm.env.items() if k != "DASK_JOBQUEUE__SLURM__LOG_DIRECTORY"}
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", *cmd[1:], *extra], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert len(summary["workers"]) >= 1
    wait_for(lambda: not slurm.jobs(), 60, "--cluster to cancel its jobs at the end")
    assert (tmp_path / "runs" / "runs" / summary["run_id"] / "result.json").exists()
    # The worker jobs' logs go under the store, said in one line, not slurm-N.out in the working directory.
    assert not list(tmp_path.glob("slurm-*.out")), sorted(p.name for p in tmp_path.iterdir())
    logs = tmp_path / "runs" / "logs"
    assert f"batch job logs: {logs}/ (set jobqueue.slurm.log-directory to change)" in out.stderr
    wait_for(lambda: any(logs.iterdir()), 60, "the worker jobs' log files")
    ref = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run",
                          "examples/saturating_pipeline.py:job", *extra], cwd=tmp_path,
                         capture_output=True, text=True, timeout=280)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_summary = json.loads(ref.stdout)
    keys = ["run_id", "n", "mean", "sd", "skewness", "kurtosis", "min", "max", "output_interval95_percentile"]
    assert {k: summary[k] for k in keys} == {k: ref_summary[k] for k in keys}


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_documented_batch_script_starts_dask_research_workers(slurm, tmp_path):
    script = tmp_path / "worker.sbatch"
    script.write_text(_doc_block("worker.sbatch"))
    # The documented submission; SCHEDULER (exported in the docs) is this test's scheduler.
    lines = [ln for ln in _doc_block("submit the workers").splitlines() if ln.strip()]
    assert lines[0].startswith("export SCHEDULER=")
    submit = shlex.split(lines[-1], comments=True)
    assert submit[0] == "sbatch" and submit[-1] == "worker.sbatch"
    job = _job()
    with LocalCluster(n_workers=0, host="127.0.0.1", protocol="tcp", dashboard_address=None, processes=False) as cl, \
            Client(cl, set_as_default=False) as client:
        env = dict(slurm.env, SCHEDULER=cl.scheduler_address)
        out = subprocess.run(submit, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        try:
            client.wait_for_workers(2, timeout=120)
            res = mc.run(job, client=client, verify=2, progress=False)
        finally:
            slurm.run("scancel", f"--name={_sbatch_name(script)}")
        assert len(res.workers) == 2
    assert res.state == _embedded(job).state
    wait_for(lambda: not slurm.jobs(), 60, "the worker jobs to end")


def _sbatch_name(script) -> str:
    return re.search(r"#SBATCH --job-name=(\S+)", script.read_text()).group(1)


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_getting_started_slurm_command_works_on_a_new_account(slurm, tmp_path):
    """No jobqueue.slurm config (a new account): cores and memory per job come from sinfo, said in
    one line (the command printed "... for example:" and stopped)."""
    text = open(os.path.join(REPO, "docs", "getting-started.rst")).read().replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines() if "--cluster slurm" in ln and "dask-research mc run" in ln]
    cmd = shlex.split(line, comments=True)
    assert "--cores" not in cmd and "--memory" not in cmd
    (tmp_path / "examples").mkdir()
    shutil.copy(os.path.join(REPO, "examples", "saturating_pipeline.py"), tmp_path / "examples")
    env = {k: v for k, v in slurm.env.items() if not k.startswith("DASK_JOBQUEUE__")}
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", *cmd[1:], "--shards", "8", "--no-progress",
                          "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    memory = f"{slurm.memory_mb // 1024}GiB" if slurm.memory_mb >= 1024 else f"{slurm.memory_mb}MiB"
    assert (f"--cluster slurm: cores {slurm.cpus}, memory {memory} per job, from sinfo for the default partition's "
            "smallest node; pass --cores N --memory 4GB") in out.stderr, out.stderr[-2000:]
    assert json.loads(out.stdout)["n"] == 8 * 65_536
    wait_for(lambda: not slurm.jobs(), 60, "--cluster to cancel its jobs at the end")


@pytest.mark.timeout(300, method="thread")
def test_a_partition_it_lacks_or_a_job_no_node_holds_is_a_usage_error_before_submitting(slurm, tmp_path):
    base = [sys.executable, "-m", "dask_research.cli", "mc", "run", os.path.join(REPO, "examples",
            "saturating_pipeline.py") + ":job", "--cluster", "slurm", "--no-progress", "--memory", "1GB"]
    for extra, message in ((["--queue", "nosuch", "--cores", "1"],
                            f"queue='nosuch' is invalid; expected a partition of this SLURM cluster: {slurm.partition}"),
                           (["--queue", slurm.partition, "--cores", str(slurm.cpus + 1)],
                            f"cores={slurm.cpus + 1} is invalid; expected at most {slurm.cpus}, the most CPUs of "
                            f"partition {slurm.partition}'s nodes")):
        out = subprocess.run(base + extra, cwd=tmp_path, env=slurm.env, capture_output=True, text=True, timeout=200)
        assert out.returncode == 2, out.stderr[-3000:]
        assert message in out.stderr and len(out.stderr.strip().splitlines()) <= 2, out.stderr[-3000:]
        assert not slurm.jobs()                  # nothing was submitted


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_stopping_the_cli_mid_run_cancels_its_jobs_pending_ones_too(slurm, tmp_path, how):
    """Ctrl-C was a silent exit 0 (dask-jobqueue sets SIGINT to sys.exit()); SIGTERM ended the
    command at once and its pending jobs stayed queued, to start later with no scheduler."""
    import signal
    import time

    shutil.copy(os.path.join(REPO, "examples", "saturating_pipeline.py"), tmp_path)
    # jobs of every core of the node: one runs, two are pending
    cmd = [sys.executable, "-m", "dask_research.cli", "mc", "run", "saturating_pipeline.py:job", "--shards", "100000",
           "--cluster", "slurm", "--jobs", "3", "--cores", str(slurm.cpus), "--memory", "1GB",
           "--queue", slurm.partition, "--store", "runs/", "--no-progress"]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=slurm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: len(slurm.jobs("RUNNING")) == 1 and len(slurm.jobs("PENDING")) == 2, 120,
                 "one running and two pending worker jobs")
        time.sleep(2)
        os.killpg(p.pid, getattr(signal, how))
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 128 + getattr(signal, how), err[-2000:]      # interrupted (130 / 143), not failed (1)
    assert [ln for ln in err.splitlines() if ln.startswith("Error:")][-1].startswith("Error: interrupted"), err[-2000:]
    wait_for(lambda: not slurm.jobs(), 15, "the command to cancel its jobs, the pending ones too")
