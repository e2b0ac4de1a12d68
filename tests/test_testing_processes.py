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
