"""dask_research.testing.processes: ports and stopping processes, the helpers tests share."""
import socket
import subprocess
import sys

import pytest

from dask_research.testing.processes import free_ports, stop_processes


def test_free_ports_are_distinct_and_refuse_connections():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", ports[0])) != 0


@pytest.mark.timeout(60, method="thread")
def test_stop_processes_terminates_then_kills():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen([sys.executable, "-c",
                                 "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    stop_processes([polite, stubborn], timeout=1.0)
    assert polite.returncode == -15            # SIGTERM
    assert stubborn.returncode == -9           # ignored SIGTERM: killed after the timeout
    stubborn.stdout.close()


@pytest.mark.timeout(180, method="thread")
def test_a_test_process_killed_mid_test_takes_its_scheduler_and_workers_with_it(tmp_path):
    """A test ended by its timeout (``os._exit``) or a signal runs no ``finally``: the real
    ``dask scheduler``/``dask worker`` processes :func:`process_cluster` started lived on, using
    the machine's CPU for the rest of the suite (found after a session's runs: three idle clusters,
    80 minutes old). A process that SIGKILLs itself inside the cluster leaves no process behind."""
    import os
    import signal

    from dask_research.testing.processes import run_python, wait_for

    code = f"""
        import os, pathlib, signal
        from dask_research.testing.processes import process_cluster
        with process_cluster(pathlib.Path({str(tmp_path)!r}), 2) as cluster:
            pids = [cluster.scheduler.pid, *(w.pid for w in cluster.workers)]
            pathlib.Path({str(tmp_path / "pids")!r}).write_text(" ".join(map(str, pids)))
            os.kill(os.getpid(), signal.SIGKILL)
    """
    out = run_python(code, tmp_path, timeout=150)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:            # a zombie waiting for init counts as gone
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    try:
        wait_for(lambda: all(gone(p) for p in pids), 30, "the cluster's processes to die with the test")
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
