"""However the suite is stopped, the test SLURM stops with it: no slurmctld, slurmd, munged or
job process outlives a pytest that was interrupted (Ctrl-C), terminated (``timeout``'s
SIGTERM) or killed (SIGKILL) in the middle of a SLURM test.

Each case starts pytest in a process of its own on a test that holds a running batch job,
stops that pytest the given way, and then waits (generously) until every process of that
SLURM (found by the ``SLURM_CONF`` in its environment) has ended.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dask_research.testing import slurm as slurm_mod
from dask_research.testing.processes import wait_for

pytestmark = pytest.mark.skipif(slurm_mod.missing() is not None, reason=str(slurm_mod.missing()))

CONFTEST = '''
import pytest


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    from dask_research.testing.slurm import slurm_fixture

    yield from slurm_fixture(tmp_path_factory)
'''

HOLDS_A_JOB = '''
import json, os, time


def test_holds_a_running_job(slurm):
    r = slurm.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 600")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 120
    while not slurm.jobs("RUNNING"):
        assert time.monotonic() < deadline, slurm.jobs()
        time.sleep(0.2)
    mark = os.environ["SLURM_EXIT_MARK"]
    with open(mark + ".tmp", "w") as f:
        json.dump({"conf": slurm.conf, "munge_dir": slurm.munge_dir,
                   "daemons": {n: p.pid for n, p in slurm.procs.items()}}, f)
    os.replace(mark + ".tmp", mark)
    time.sleep(600)                  # stopped from outside long before this ends
'''


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (``/proc/PID/stat``), None once it ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def _processes_of(conf: str) -> dict[int, tuple[str, str]]:
    """Every live process whose environment names ``conf`` as its SLURM_CONF: pid -> (start, command)."""
    mark = b"\0SLURM_CONF=" + conf.encode() + b"\0"
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        start = _start_time(int(name))
        if mark in env and start is not None:
            found[int(name)] = (start, cmd)
    return found


@pytest.mark.slow
@pytest.mark.timeout(420, method="thread")
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_stopping_pytest_mid_test_stops_every_slurm_process(tmp_path, how):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_holds_a_job.py").write_text(textwrap.dedent(HOLDS_A_JOB))
    mark = tmp_path / "started.json"
    env = {**os.environ, "SLURM_EXIT_MARK": str(mark)}
    env.pop("SLURM_CONF", None)
    log = open(tmp_path / "inner.log", "wb")
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                              "test_holds_a_job.py"], cwd=tmp_path, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: mark.exists() or inner.poll() is not None, 240, "the inner SLURM test to hold a job")
        assert mark.exists(), (tmp_path / "inner.log").read_text()
        info = json.loads(mark.read_text())

        def commands() -> str:
            return " | ".join(cmd for _, cmd in _processes_of(info["conf"]).values())

        # RUNNING in squeue comes before slurmstepd has started the job's own process: wait for it.
        with contextlib.suppress(AssertionError):           # the assertion below says what ran
            wait_for(lambda: "sleep 600" in commands(), 60, "the job's process to start")
        before = _processes_of(info["conf"])
        seen = " | ".join(cmd for _, cmd in before.values())
        for name, pid in info["daemons"].items():
            assert pid in before, (name, seen)              # the daemons carry the SLURM's conf
        assert "sleep 600" in seen, seen                    # and so does the job's process
        if how == "SIGINT":          # Ctrl-C: the terminal signals the foreground process group
            os.killpg(inner.pid, signal.SIGINT)
        else:
            inner.send_signal(getattr(signal, how))
        inner.wait(timeout=120)

        def gone():
            return all(_start_time(pid) != start for pid, (start, _) in before.items())

        wait_for(gone, 120, f"every process of the test SLURM to end after {how}")
        assert not _processes_of(info["conf"])
        wait_for(lambda: not os.path.exists(info["munge_dir"]), 60, "the MUNGE directory to be removed")
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait(timeout=30)
        log.close()
