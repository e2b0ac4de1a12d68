"""Real ``dask scheduler`` / ``dask worker`` processes for the deployment tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dask_research.testing.processes import stop_processes, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dask(*args: str) -> list[str]:
    """``dask ...`` with this interpreter (the console script of the environment under test)."""
    return [sys.executable, "-m", "distributed.cli.dask_scheduler" if args[0] == "scheduler"
            else "distributed.cli.dask_worker", *args[1:]]


@pytest.fixture
def dask_processes(tmp_path_factory):
    """A scheduler and two one-thread workers as separate processes, started in an empty
    directory of their own: they cannot see a job file through their working directory or
    ``sys.path``. Yields the scheduler's address; every process is stopped by its pid."""
    where = tmp_path_factory.mktemp("cluster-cwd")
    sfile = where / "scheduler.json"
    env = dict(os.environ)      # PYTHONPATH included: the workers import this checkout
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        log = open(where / "scheduler.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen(_dask("scheduler", "--host", "127.0.0.1", "--port", "0",
                                            "--no-dashboard", "--scheduler-file", str(sfile)),
                                      cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_for(lambda: sfile.exists() and sfile.stat().st_size > 0, 60, "the scheduler file")
        address = json.loads(sfile.read_text())["address"]
        for i in range(2):
            log = open(where / f"worker{i}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(_dask("worker", address, "--nthreads", "1", "--no-dashboard",
                                                "--no-nanny", "--name", f"w{i}"),
                                          cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
            cwds = c.run(os.getcwd)
        assert set(cwds.values()) == {str(where)}
        yield address
    finally:
        stop_processes(procs)
        for log in logs:
            log.close()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A single-node SLURM of this machine (skips, saying why, where it cannot run)."""
    from dask_research.testing.slurm import slurm_fixture

    yield from slurm_fixture(tmp_path_factory)
