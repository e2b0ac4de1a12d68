"""One writer per checkpoint directory for the writer's lifetime (issue 25), on real processes.

Before the durable layer a writer held ``flock`` for one write only: two live processes
checkpointing one directory both "committed", interleaved, and the first plane's checkpoint was
silently replaced by the second's. Now a plane's first checkpoint into a directory takes the
directory's lease and keeps it until the plane is closed: a second live writer is refused
naming the first, a killed one is taken over at once, a frozen one after the lease timeout (by
the new writer's own clock), and the frozen one, woken, stops before writing anything.

Every wait is for an event with a generous bound; the only time asserted is a lower bound
measured by the waiting process's own clock.
"""
from __future__ import annotations

import gc
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from dask_research.exceptions import CheckpointError
from dask_research.replay import ExperiencePlane, checkpoints
from dask_research.testing.processes import line_processes

WRITER = str(Path(__file__).with_name("checkpoint_writer.py"))
BOUND = 120.0


@pytest.fixture
def writers():
    """``writers(ck, start, timeout=None)``: a checkpoint_writer.py process, spoken to line by line."""
    with line_processes(BOUND) as start:
        yield lambda ck, first, timeout=None: start(
            [sys.executable, WRITER, str(ck), str(first)] + ([] if timeout is None else [str(timeout)]))


def _restored_keys(ck: Path) -> list[int]:
    plane = ExperiencePlane.restore(ck)
    try:
        return plane.contents()["action"].tolist()
    finally:
        plane.close()


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_second_live_process_is_refused_for_the_first_ones_lifetime(tmp_path, writers):
    ck = tmp_path / "ck"
    a = writers(ck, 0)
    assert a.next_line().startswith("committed v000001")
    b = writers(ck, 1000)                     # a second plane, in another live process
    line = b.next_line()
    assert line.startswith("refused: "), line
    assert f"on host {socket.gethostname()}, pid {a.proc.pid}" in line, line   # names the holder
    assert "whose lease is alive" in line and "one writer per checkpoint directory" in line, line
    assert b.proc.wait(BOUND) == 3
    assert _restored_keys(ck) == list(range(10))                 # A's checkpoint, not replaced
    a.send("again")                                              # A is still the writer
    assert a.next_line().startswith("committed v000002")
    assert _restored_keys(ck) == list(range(15))
    holder = json.loads((ck / checkpoints.LEASE).read_text())
    assert holder["pid"] == a.proc.pid and holder["host"] == socket.gethostname()
    a.send("close")                                              # ... until its plane is closed
    assert a.next_line() == "closed"
    assert not (ck / checkpoints.LEASE).exists()
    c = writers(ck, 2000)
    assert c.next_line().startswith("committed v000003")
    assert _restored_keys(ck) == list(range(2000, 2010))


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_killed_writer_is_taken_over_at_once(tmp_path, writers):
    ck = tmp_path / "ck"
    a = writers(ck, 0)
    assert a.next_line().startswith("committed v000001")
    a.proc.kill()
    assert a.proc.wait(BOUND) == -signal.SIGKILL
    assert json.loads((ck / checkpoints.LEASE).read_text())["pid"] == a.proc.pid   # left behind
    b = writers(ck, 1000)                     # its pid is dead on this host: no wait
    assert b.next_line().startswith("committed v000002")
    assert _restored_keys(ck) == list(range(1000, 1010))
    names = sorted(p.name for p in ck.iterdir() if p.name not in (checkpoints.LEASE, checkpoints.LOCK,
                                                                    checkpoints.LEASE + ".taken"))   # the taker's note
    assert names == ["CURRENT", "v000002"]


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_frozen_writer_is_taken_over_after_the_timeout_and_stops_when_it_wakes(tmp_path, writers):
    ck = tmp_path / "ck"
    a = writers(ck, 0, timeout=2.0)
    assert a.next_line().startswith("committed v000001")
    os.kill(a.proc.pid, signal.SIGSTOP)
    b = writers(ck, 1000, timeout=2.0)
    line = b.next_line()
    took = float(re.search(r"after ([0-9.]+) s", line).group(1))
    assert line.startswith("committed v000002") and took >= 2.0, line    # B's own clock: >= the timeout
    os.kill(a.proc.pid, signal.SIGCONT)
    a.send("again")
    line = a.next_line()
    assert line.startswith("refused: ") and "lost the lease" in line, line
    assert f"pid {b.proc.pid}" in line, line                            # ... naming who holds it now
    assert _restored_keys(ck) == list(range(1000, 1010))               # nothing of A's was written
    assert checkpoints.current(ck).name == "v000002"
    a.send("again")                                   # asks for the lease anew: B holds it, alive
    line = a.next_line()
    assert line.startswith("refused: ") and f"pid {b.proc.pid}" in line and "whose lease is alive" in line, line
    b.send("close")
    assert b.next_line() == "closed"
    a.send("again")                                   # free again: A may be its writer once more
    assert a.next_line().startswith("committed v000003")
    assert _restored_keys(ck) == list(range(25))      # A's plane as it is now (10 + 5 + 5 + 5)


def test_two_planes_of_one_process_are_one_writer_at_a_time(tmp_path):
    ck = tmp_path / "ck"
    first = ExperiencePlane({"action": ((), "int64")}, capacity=10)
    first.ingest({"action": np.arange(3)})
    first.checkpoint(ck)
    second = ExperiencePlane({"action": ((), "int64")}, capacity=10)
    second.ingest({"action": np.arange(100, 104)})
    with pytest.raises(CheckpointError, match="already held by another writer in this process"):
        second.checkpoint(ck)
    assert _restored_keys(ck) == [0, 1, 2]
    first.checkpoint(ck)                            # the holder goes on
    del first                                       # collected unclosed: its lease goes with it
    gc.collect()
    second.checkpoint(ck)
    assert _restored_keys(ck) == [100, 101, 102, 103]
    second.close()
    assert not (ck / checkpoints.LEASE).exists()
