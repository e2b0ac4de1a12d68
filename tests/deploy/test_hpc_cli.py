"""``--cluster NAME``: dask-jobqueue by name, and its failures in one line (no SLURM needed)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from .conftest import REPO

pytest.importorskip("dask_jobqueue")
JOB = os.path.join(REPO, "examples", "saturating_pipeline.py") + ":job"


def cli(args, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("DASK_JOBQUEUE__")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "dask_research.cli", *args], capture_output=True, text=True,
                          timeout=120, env=full)


def _errors(out) -> list[str]:
    """stderr without Python warnings (a dashboard port in use on a shared machine)."""
    lines = out.stderr.strip().splitlines()
    return [ln for ln in lines if ln.startswith("Error:")] if "Traceback" not in out.stderr else lines


def test_every_jobqueue_class_by_name():
    import dask_jobqueue

    from dask_research.exceptions import InputError
    from dask_research.hpc import JOBQUEUE_CLUSTERS, jobqueue_cluster_class

    for name, cls in JOBQUEUE_CLUSTERS.items():
        assert jobqueue_cluster_class(name) is getattr(dask_jobqueue, cls)
        assert jobqueue_cluster_class(name.upper()) is getattr(dask_jobqueue, cls)
    with pytest.raises(InputError, match="one of htcondor, lsf, moab, oar, pbs, sge, slurm"):
        jobqueue_cluster_class("kubernetes")


@pytest.mark.timeout(120, method="thread")
def test_a_submission_the_batch_system_refuses_is_one_line_not_a_hang(tmp_path):
    # No sbatch on PATH: dask-jobqueue's submission fails in a background callback; the
    # command must say so and exit, not wait for workers forever.
    store = tmp_path / "runs"
    out = cli(["mc", "run", JOB, "--cluster", "slurm", "--jobs", "2", "--cores", "1", "--memory", "2GB",
               "--no-progress", "--store", str(store)], PATH=os.path.dirname(sys.executable))
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert _errors(out) == ["Error: could not submit the slurm jobs: FileNotFoundError: "
                            "[Errno 2] No such file or directory: 'sbatch'"]
    assert f"batch job logs: {store}/logs/" in out.stderr
    assert not store.exists()          # no job ran: its empty log directory (and the store it made) went


@pytest.mark.timeout(120, method="thread")
@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not installed")
def test_sbatch_errors_are_reported_with_its_own_words(tmp_path):
    # An empty configuration: sbatch refuses it at once (a missing one, it retries for 60 s).
    conf = tmp_path / "empty-slurm.conf"
    conf.write_text("")
    out = cli(["mc", "run", JOB, "--cluster", "slurm", "--cores", "1", "--memory", "2GB", "--no-progress"],
              SLURM_CONF=str(conf))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [line] = _errors(out)
    assert line.startswith("Error: could not submit the slurm jobs: sbatch said 'sbatch: "), line


@pytest.mark.parametrize("args, code, message", [
    # No jobqueue.slurm config and no SLURM to ask (sinfo fails here): one line that keeps the hint.
    (["--cluster", "slurm"], 1, "cannot tell the cores and memory of a SLURM job: sinfo says nothing of the "
                                "default partition's nodes"),
    (["--cluster", "kubernetes"], 2, "Invalid value for '--cluster'"),
    (["--queue", "short"], 2, "--queue applies only with --cluster NAME"),
    (["--cluster", "slurm", "--scheduler", "tcp://127.0.0.1:8786"], 2, "give --scheduler or --cluster, not both"),
    (["--cluster", "slurm", "--jobs", "0"], 2, "Invalid value for '--jobs'"),
    # checked before any job is submitted (a typo was a job sbatch refused, or one that never ran)
    (["--cluster", "slurm", "--memory", "4QB"], 2, "'4QB' is not a memory size; expected a positive size"),
    (["--cluster", "slurm", "--memory", "0GB"], 2, "'0GB' is not a memory size"),
    (["--cluster", "slurm", "--walltime", "1h"], 2, "'1h' is not a time limit; expected HH:MM:SS"),
    (["--cluster", "slurm", "--walltime", "0:00:00"], 2, "'0:00:00' is not a time limit"),
])
@pytest.mark.timeout(120, method="thread")
def test_cluster_options_are_checked(args, code, message, tmp_path):
    # An sinfo that cannot reach a controller, whatever this machine runs: another test may have
    # a real SLURM up at the same moment (the suite runs in parallel), and then the job ran.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Could not establish a configuration source' >&2\n"
                                "exit 1\n")
    (fake / "sinfo").chmod(0o755)
    out = cli(["mc", "run", JOB, "--no-progress", *args], PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert out.returncode == code, out.stderr
    [line] = _errors(out)
    assert message in line, line


def test_where_sinfo_cannot_tell_the_line_keeps_the_hint(tmp_path):
    """The getting-started command on a new account printed "... for example:" and stopped."""
    import dask

    from dask_research.exceptions import ResearchError
    from dask_research.hpc import slurm_job_size

    silent = tmp_path / "sinfo"
    silent.write_text("#!/bin/sh\necho 'sinfo: error: Invalid partition name specified' >&2\nexit 1\n")
    silent.chmod(0o755)
    with dask.config.set({"jobqueue.slurm.cores": None, "jobqueue.slurm.memory": None}):
        with pytest.raises(ResearchError) as e:
            slurm_job_size({"queue": "gpu"}, sinfo=str(silent))
    text = str(e.value)
    assert "\n" not in text and "partition 'gpu'" in text and "Invalid partition name" in text
    assert "pass --cores N --memory 4GB, or set jobqueue.slurm.cores and .memory" in text
    two_nodes = tmp_path / "sinfo2"
    two_nodes.write_text("#!/bin/sh\nprintf '8 31000\\n4+ 15900\\n'\n")
    two_nodes.chmod(0o755)
    with dask.config.set({"jobqueue.slurm.cores": None, "jobqueue.slurm.memory": None}):
        assert slurm_job_size({"queue": "debug"}, sinfo=str(two_nodes)) == {"cores": 4, "memory": "15GiB"}
        assert slurm_job_size({"queue": "debug", "cores": 2}, sinfo=str(two_nodes)) == {"memory": "15GiB"}


def test_a_partition_slurm_lacks_or_a_job_no_node_holds_is_refused_before_submitting(tmp_path):
    """A job larger than every node of its partition stayed pending for ever and the run waited
    without a word; a misspelt partition was sbatch's refusal, exit 1, after the cluster started."""
    import dask

    from dask_research.exceptions import InputError
    from dask_research.hpc import slurm_check_request

    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\nprintf 'debug* 8 31000\\ndebug* 2 64000\\nbig 64+ 500000\\n'\n")
    sinfo.chmod(0o755)

    def check(**given):
        with dask.config.set({"jobqueue.slurm.cores": None, "jobqueue.slurm.memory": None,
                              "jobqueue.slurm.queue": None}):
            slurm_check_request(given, sinfo=str(sinfo))

    with pytest.raises(InputError, match=r"queue='nosuch' is invalid; expected a partition of this SLURM "
                                         r"cluster: big, debug"):
        check(queue="nosuch")
    with pytest.raises(InputError, match=r"cores=16 is invalid; expected at most 8, the most CPUs of "
                                         r"partition debug's nodes \(a larger job would wait"):
        check(cores=16, memory="1GB")
    with pytest.raises(InputError, match=r"memory='80GB' is invalid; expected at most 62GiB"):
        check(cores=1, memory="80GB")
    with pytest.raises(InputError, match=r"memory='40GB' is invalid; expected a size that fits beside 8 cores"):
        check(cores=8, memory="40GB")         # 8 cores on one node, 64 GB on the other: neither has both
    check(cores=8, memory="30GB")             # 30 GB asks SLURM for 28 GiB (28672 MB): it fits
    check(queue="big", cores=64, memory="400GB")
    check()                                   # nothing asked for: nothing to refuse
    with pytest.raises(InputError, match="cores=16"):
        with dask.config.set({"jobqueue.slurm.cores": 16, "jobqueue.slurm.memory": "1GB"}):
            slurm_check_request({}, sinfo=str(sinfo))        # the configured size is checked too


def test_importing_dask_jobqueue_keeps_ctrl_c():
    # dask_jobqueue.runner sets SIGINT to sys.exit() on import: Ctrl-C in `mc run --cluster slurm`
    # was a silent exit 0 (no "interrupted" line), not KeyboardInterrupt.
    code = ("import signal; from dask_research.hpc import jobqueue_cluster_class; jobqueue_cluster_class('slurm'); "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


@pytest.mark.timeout(60, method="thread")
def test_sigterm_while_jobs_are_ours_interrupts_and_closes_the_cluster(monkeypatch):
    # SIGTERM ended the command at once: its pending batch jobs stayed queued and started later
    # with no scheduler. Now it is a KeyboardInterrupt and closing the cluster cancels them.
    import signal

    import distributed

    from dask_research import hpc

    closed = []

    class Cluster:
        def __init__(self, **kwargs):
            pass

        def close(self):
            closed.append(True)

    class Client:
        def __init__(self, cluster):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(hpc, "jobqueue_cluster_class", lambda name: Cluster)
    monkeypatch.setattr(hpc, "_submit", lambda cluster, name, jobs: None)
    monkeypatch.setattr(distributed, "Client", Client)
    with pytest.raises(KeyboardInterrupt):
        with hpc.jobqueue_client("pbs", jobs=1, cores=1, memory="1GB"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                # the handler interrupts it
    assert closed == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
