"""A hung test ends the run loudly: the suite's own timeout settings, on a real C-level deadlock.

The suite once hung for good on a fresh machine with every thread deadlocked inside Dask's
profiler (``sys._current_frames``). pytest-timeout's signal method cannot fire there: the
alarm's Python handler only runs when the blocked C call returns. These tests run pytest in a
subprocess, with this project's ``setup.cfg``, on a test that deadlocks in
``pthread_mutex_lock`` (a C call no signal interrupts), and check that the run ends with a
timeout report instead of hanging.
"""
import configparser
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import dask
import pytest

ROOT = Path(__file__).resolve().parents[1]

DEADLOCK = textwrap.dedent("""
    import ctypes

    def test_deadlocks_in_c():
        libc = ctypes.CDLL(None)             # CDLL releases the GIL around the call
        mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t: a normal mutex
        assert libc.pthread_mutex_lock(mutex) == 0
        libc.pthread_mutex_lock(mutex)       # locks itself out: never returns
""")


def test_the_suite_uses_the_thread_timeout_method():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["tool:pytest"]["timeout_method"].strip() == "thread"
    assert int(cfg["tool:pytest"]["timeout"]) > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_test_deadlocked_in_c_ends_the_run_with_a_report(tmp_path):
    (tmp_path / "test_hang.py").write_text(DEADLOCK)
    # The suite's settings and its root conftest (which turns a worker's timeout into a report).
    (tmp_path / "test_after.py").write_text("def test_runs_after_the_hang():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "setup.cfg"), "--rootdir",
                           str(tmp_path), "-p", "conftest", "-o", "timeout=3", "-p", "no:cacheprovider",
                           str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Timeout" in out and "test_deadlocks_in_c" in out
    # the report is the hung test's failure: the stack of the thread that deadlocked, once
    failures = re.findall(r"^FAILED (\S+)", out, flags=re.M)
    assert failures == ["test_hang.py::test_deadlocks_in_c"], out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "Stack of MainThread" in out and "libc.pthread_mutex_lock(mutex)" in out, out[-3000:]


def test_in_process_test_clusters_run_without_the_statistical_profiler():
    assert dask.config.get("distributed.worker.profile.enabled") is False
