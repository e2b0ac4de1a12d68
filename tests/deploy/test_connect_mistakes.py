"""A newcomer's mistakes with ``--scheduler``, against real processes: a port where something
else listens (the dashboard's, typed for the scheduler's), a malformed address, a host name
that does not resolve, a scheduler whose workers are not started yet. Each is one line; none
waits without a bound or without a word."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dask_research.cli import main
from dask_research.testing.processes import (
    LineProcess,
    dies_with_this_process,
    free_ports,
    process_cluster,
    subprocess_env,
)

from .conftest import REPO

CLI = [sys.executable, "-m", "dask_research.cli"]
RUN = ["mc", "run", "examples/saturating_pipeline.py:job", "--shards", "8", "--no-progress", "--store", "runs/"]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "examples").mkdir()
    shutil.copy(os.path.join(REPO, "examples", "saturating_pipeline.py"), tmp_path / "examples")
    return tmp_path


@pytest.mark.timeout(180, method="thread")
def test_a_port_where_something_else_listens_is_one_line_not_a_silent_wait(project):
    """Before: no output, for ever (Client's timeout bounds the connection, not the handshake)."""
    port = free_ports(1)[0]
    http = subprocess.Popen(dies_with_this_process([sys.executable, "-m", "http.server", str(port),
                                                    "--bind", "127.0.0.1"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=project)
    try:
        LineProcess([sys.executable, "-c", f"import socket,time\nfor _ in range(600):\n    try:\n"
                     f"        socket.create_connection(('127.0.0.1', {port}), 1).close(); break\n"
                     f"    except OSError: time.sleep(0.1)\nprint('up', flush=True)"]).expect("up")
        env = {**subprocess_env(), "DASK_RESEARCH__CLI__CONNECT_TIMEOUT": "1"}
        out = subprocess.run(CLI + RUN + ["--scheduler", f"tcp://127.0.0.1:{port}"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=150)
    finally:
        http.kill()
        http.wait(30)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "did not answer as a Dask scheduler" in lines[0] and "8786" in lines[0]
    assert not (project / "runs").exists()


@pytest.mark.parametrize("address", ["tcp//127.0.0.1:8786", "tcp:/127.0.0.1:8786"])
def test_a_malformed_address_is_a_usage_error_before_anything_is_asked(address):
    out = CliRunner().invoke(main, RUN + ["--scheduler", address])
    assert out.exit_code == 2, out.output
    assert "is not a scheduler address" in out.output and len(out.output.strip().splitlines()) == 1


@pytest.mark.timeout(120, method="thread")
def test_a_host_name_that_does_not_resolve_is_named(project):
    env = {**subprocess_env(), "DASK_RESEARCH__CLI__CONNECT_TIMEOUT": "1"}
    out = subprocess.run(CLI + RUN + ["--scheduler", "tcp://no-such-host.invalid:8786"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 1, out.stderr
    assert "'no-such-host.invalid' does not resolve" in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(300, method="thread")
def test_a_scheduler_without_workers_is_said_and_the_run_goes_on_when_one_joins(project, tmp_path_factory):
    where = tmp_path_factory.mktemp("no-workers")
    with process_cluster(where, 0) as cluster:
        address = cluster.client.scheduler.address
        cmd = " ".join([*CLI, *RUN, "--scheduler", address])
        run = LineProcess(["sh", "-c", f"cd {project} && exec {cmd} 2>&1"], bound=240)
        worker = None
        try:
            line = run.expect("the scheduler at")
            assert "has no workers yet" in line and f"dask worker {address}" in line
            worker = subprocess.Popen(dies_with_this_process([sys.executable, "-m", "distributed.cli.dask_worker",
                                                              address, "--nthreads", "1", "--no-dashboard"]),
                                      env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            run.expect("  mean")
            assert run.proc.wait(120) == 0
        finally:
            run.stop()
            if worker is not None:
                worker.kill()
                worker.wait(30)


def test_cluster_options_without_a_cluster_are_refused():
    """``--jobs 4`` without ``--cluster`` ran on the embedded cluster without a word."""
    out = CliRunner().invoke(main, RUN + ["--jobs", "4"])
    assert out.exit_code == 2 and "--jobs applies only with --cluster NAME" in out.output, out.output
