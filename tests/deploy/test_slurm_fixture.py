"""The test SLURM itself: this machine's node, its own ports and files, a clear skip reason."""
from __future__ import annotations

import os
import re

import pytest

from dask_research.testing import slurm as slurm_mod


def test_missing_packages_give_the_reason_to_skip(monkeypatch):
    monkeypatch.setattr(slurm_mod, "_which", lambda name: None if name in ("slurmd", "munged") else "/bin/true")
    assert slurm_mod.missing() == ("SLURM is not installed (munged, slurmd missing): "
                                   "apt-get install slurm-wlm munge")


@pytest.mark.timeout(120, method="thread")
def test_the_fixture_is_one_node_of_this_machine_with_its_own_ports_and_files(slurm):
    hw = slurm_mod.node_hardware()
    node = slurm.run("scontrol", "show", "node", slurm.node).stdout
    assert f"CPUTot={hw['CPUs']}" in node and f"RealMemory={hw['RealMemory']}" in node
    assert hw["CPUs"] == os.cpu_count()
    conf = open(slurm.conf).read()
    for key in ("SlurmctldPort", "SlurmdPort"):
        port = int(re.search(rf"^{key}=(\d+)$", conf, re.M).group(1))
        assert port not in (6817, 6818)                 # not the ports of a system SLURM
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdLogFile"):
        assert re.search(rf"^{key}={re.escape(slurm.root)}/", conf, re.M), key
    assert f"AuthInfo=socket={slurm.munge_dir}/" in conf
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert slurm.env["SLURM_CONF"] == slurm.conf == os.environ["SLURM_CONF"]
    # the daemons are the fixture's children, and munged runs as user munge
    import pwd

    uid = pwd.getpwnam("munge").pw_uid
    assert os.stat(f"/proc/{slurm.procs['munged'].pid}").st_uid == uid
    assert all(p.poll() is None for p in slurm.procs.values())
