"""Every typed value of every ``dask-research`` subcommand is checked before anything starts
(issue 28): the real console command, one bad value at a time, exits 2 with one line on stderr
naming the value and what is valid, no traceback, nothing on stdout and nothing written.

The cases marked ``new`` failed on the code before this test: an unknown store protocol or an
empty ``--store`` was a run failure (exit 1) found after ``--scheduler`` had connected or
``--cluster`` had submitted its jobs (``demo --store`` even after the embedded cluster and its
dashboard started); ``mc verify --shards -1`` was a store error; a shard past the run's last was
exit 1; and ``dask-research worker`` handed a mistyped scheduler address, ``--memory-limit 4QB``,
``--nworkers 0`` or ``--death-timeout abc`` to a ``dask worker`` process that printed a 50-line
traceback (or waited for a scheduler that would never answer).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dask_research.testing.processes import free_ports

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "saturating_pipeline.py") + ":job"
_SCRIPT = Path(sys.executable).with_name("dask-research")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "dask_research.cli"]
PORT = free_ports()[0]               # nothing listens there: a check that comes too late waits or fails
SMALL = ["--shards", "2", "--no-progress"]

# (id, arguments, what the one line must contain); "{run}" and "{job}" are a stored run of a
# 4-shard job and that job (made once per module).
CASES = [
    # -- mc run -------------------------------------------------------------------------------
    ("run --shards 0", ["mc", "run", EXAMPLE, "--shards", "0"], "'--shards': 0 is not in the range x>=1"),
    ("run --seed -1", ["mc", "run", EXAMPLE, "--seed", "-1"], "'--seed': -1 is not in the range x>=0"),
    ("run --seed 2**128", ["mc", "run", EXAMPLE, "--seed", str(2**128)], "an integer in [0, 2**128)"),
    ("run --verify -1", ["mc", "run", EXAMPLE, "--verify", "-1", *SMALL], "'--verify': -1 is not in the range"),
    ("run --verify x", ["mc", "run", EXAMPLE, "--verify", "x", *SMALL], "'--verify': 'x' is not a whole number (expected one >= 0)"),
    ("run --shards-per-task 3", ["mc", "run", EXAMPLE, "--shards-per-task", "3", *SMALL], "'3' is not a power of two"),
    ("run --jobs 0", ["mc", "run", EXAMPLE, "--cluster", "slurm", "--jobs", "0", *SMALL], "'--jobs': 0 is not in"),
    ("run --cores 0", ["mc", "run", EXAMPLE, "--cluster", "slurm", "--cores", "0", *SMALL], "'--cores': 0 is not"),
    ("run --memory 4QB", ["mc", "run", EXAMPLE, "--cluster", "slurm", "--memory", "4QB", *SMALL],
     "'4QB' is not a memory size; expected a positive size such as 4GB"),
    ("run --memory -1GB", ["mc", "run", EXAMPLE, "--cluster", "slurm", "--memory", "-1GB", *SMALL],
     "'-1GB' is not a memory size"),
    ("run --walltime 1h", ["mc", "run", EXAMPLE, "--cluster", "slurm", "--walltime", "1h", *SMALL],
     "'1h' is not a time limit; expected HH:MM:SS"),
    ("run --scheduler", ["mc", "run", EXAMPLE, "--scheduler", "tcp://127.0.0.1:notaport", *SMALL],
     "is not a scheduler address"),
    ("new: run --store unknown protocol", ["mc", "run", EXAMPLE, "--store", "nosuchproto://bucket/runs", *SMALL],
     "Invalid value for --store: 'nosuchproto://bucket/runs' cannot be opened as a store (ValueError: Protocol "
     "not known: nosuchproto); expected a local path or an fsspec URL whose protocol is installed"),
    ("new: run --store empty", ["mc", "run", EXAMPLE, "--store", "", *SMALL],
     "Invalid value for --store: '' is empty; expected a local path or an fsspec URL"),
    ("new: run --store before the scheduler is asked",
     ["mc", "run", EXAMPLE, "--store", "nosuchproto://runs", "--scheduler", f"tcp://127.0.0.1:{PORT}", *SMALL],
     "'nosuchproto://runs' cannot be opened as a store"),
    ("new: run --store before batch jobs are submitted",
     ["mc", "run", EXAMPLE, "--store", "nosuchproto://runs", "--cluster", "slurm", "--cores", "1", "--memory",
      "1GB", *SMALL], "'nosuchproto://runs' cannot be opened as a store"),
    # -- mc pilot -----------------------------------------------------------------------------
    ("pilot --target-stderr nan", ["mc", "pilot", EXAMPLE, "--target-stderr", "nan"],
     "'nan' is invalid; expected a finite number above 0"),
    ("pilot --target-stderr 0", ["mc", "pilot", EXAMPLE, "--target-stderr", "0"], "'0' is invalid; expected a"),
    ("new: pilot --target-stderr 1e-300 (printed the pilot first)",
     ["mc", "pilot", EXAMPLE, "--target-stderr", "1e-300"], "1e-300 is out of reach"),
    # -- mc replay / verify / show ------------------------------------------------------------
    ("replay --shard -1", ["mc", "replay", "{run}", "--shard", "-1", "--store", "{store}"],
     "'--shard': -1 is not in the range x>=0"),
    ("new: replay --shard past the last", ["mc", "replay", "{run}", "--shard", "4", "--store", "{store}",
                                           "--job", "{job}"], "shard=4 is invalid; expected an index in [0, 4)"),
    ("new: replay --store unknown protocol", ["mc", "replay", "abc", "--shard", "1", "--store", "nosuchproto://x"],
     "'nosuchproto://x' cannot be opened as a store"),
    ("verify -k 0", ["mc", "verify", "{run}", "-k", "0", "--store", "{store}"], "'-k': 0 is not in the range"),
    ("new: verify --shards a,b", ["mc", "verify", "{run}", "--shards", "a,b", "--store", "{store}"],
     "'a,b' is not a comma-separated list of shard indices; expected whole numbers >= 0"),
    ("new: verify --shards -1", ["mc", "verify", "{run}", "--shards", "-1", "--store", "{store}", "--job", "{job}"],
     "'-1' is not a comma-separated list of shard indices"),
    ("new: verify --shards 1,1", ["mc", "verify", "{run}", "--shards", "1,1", "--store", "{store}", "--job",
                                  "{job}"], "'1,1' names a shard twice; expected each shard index once"),
    ("new: verify --shards past the last", ["mc", "verify", "{run}", "--shards", "0,9", "--store", "{store}",
                                            "--job", "{job}"], "shard=9 is invalid; expected an index in [0, 4)"),
    ("new: show --store unknown protocol", ["mc", "show", "--store", "nosuchproto://x"],
     "'nosuchproto://x' cannot be opened as a store"),
    # -- demo ---------------------------------------------------------------------------------
    ("demo --out a directory", ["demo", "--quick", "--out", "."], "not a directory"),
    ("new: demo --store unknown protocol", ["demo", "--quick", "--store", "nosuchproto://x"],
     "'nosuchproto://x' cannot be opened as a store"),
    ("new: demo --store empty (ran the demo with the working directory as the store)",
     ["demo", "--quick", "--store", ""], "Invalid value for --store: '' is empty; expected a local path"),
    # -- worker -------------------------------------------------------------------------------
    ("worker --battery-floor 130%", ["worker", f"tcp://127.0.0.1:{PORT}", "--battery-floor", "130%"],
     "'130%' is not a battery floor"),
    ("worker --budget 1x", ["worker", f"tcp://127.0.0.1:{PORT}", "--budget", "1x"], "'1x' is not a compute budget"),
    ("new: worker SCHEDULER protocol", ["worker", "htp://127.0.0.1:1"],
     "Invalid value for SCHEDULER: 'htp://127.0.0.1:1' has an unknown protocol 'htp'; expected PROTOCOL://HOST:PORT"),
    ("new: worker SCHEDULER port", ["worker", "tcp://127.0.0.1:notaport"], "is not a scheduler address"),
    ("new: worker --nthreads x", ["worker", f"tcp://127.0.0.1:{PORT}", "--nthreads", "x"],
     "dask worker: Invalid value for '--nthreads': 'x' is not a valid integer"),
    ("new: worker --nthreads -2", ["worker", f"tcp://127.0.0.1:{PORT}", "--nthreads", "-2"],
     "-2 is not a thread count"),
    ("new: worker --nworkers 0", ["worker", f"tcp://127.0.0.1:{PORT}", "--nworkers", "0"],
     "'0' is not a number of worker processes; expected auto, a whole number >= 1"),
    ("new: worker --memory-limit 4QB", ["worker", f"tcp://127.0.0.1:{PORT}", "--memory-limit", "4QB"],
     "'4QB' is not a memory limit; expected auto, a size such as 8GiB"),
    ("new: worker --memory-limit -1GB", ["worker", f"tcp://127.0.0.1:{PORT}", "--memory-limit", "-1GB"],
     "'-1GB' is not a memory limit"),
    ("new: worker --death-timeout abc", ["worker", f"tcp://127.0.0.1:{PORT}", "--death-timeout", "abc"],
     "'abc' is not a duration; expected seconds (60) or a duration such as 90s"),
    ("new: worker --lifetime -5", ["worker", f"tcp://127.0.0.1:{PORT}", "--lifetime", "-5"], "'-5' is not a duration"),
    ("new: worker --resources GPU", ["worker", f"tcp://127.0.0.1:{PORT}", "--resources", "GPU"],
     "'GPU' is not a list of resources; expected NAME=AMOUNT pairs"),
    ("new: worker an unknown option", ["worker", f"tcp://127.0.0.1:{PORT}", "--no-such-option"],
     "dask worker: No such option '--no-such-option'"),
]

TINY_JOB = textwrap.dedent("""
    import numpy as np
    from dask_research import montecarlo as mc

    def pipeline(a):
        return a * np.exp(a)

    job = mc.Job(pipeline, {"a": mc.Normal(0.0, 0.1)}, shards=4, samples_per_shard=1024, seed=5, name="tiny")
""")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A stored run of a 4-shard job: (run id, store, FILE:job)."""
    where = tmp_path_factory.mktemp("stored")
    (where / "tiny.py").write_text(TINY_JOB)
    out = subprocess.run([*COMMAND, "mc", "run", "tiny.py:job", "--store", "runs", "--json", "--no-progress"],
                         capture_output=True, text=True, timeout=300, cwd=where)
    assert out.returncode == 0, out.stderr
    run_id = __import__("json").loads(out.stdout)["run_id"]
    return run_id, str(where / "runs"), f"{where / 'tiny.py'}:job"


def _run(args: list[str], cwd: Path) -> tuple[int | None, str, str]:
    """The command in its own process group; a check that comes too late (a worker that starts and
    waits for a scheduler nobody runs) is killed with its children after a generous bound."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_JOBQUEUE__")}
    env["DASK_RESEARCH__CLI__CONNECT_TIMEOUT"] = "30s"      # a late check would wait it out, then exit 1
    proc = subprocess.Popen([*COMMAND, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


@pytest.mark.timeout(200, method="thread")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_is_one_usage_line_before_anything_starts(case, stored, tmp_path):
    _, args, message = case
    run_id, store, job = stored
    args = [a.format(run=run_id, store=store, job=job) for a in args]
    code, out, err = _run(args, tmp_path)
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("Error: ") and message in lines[0], lines[0]
    assert "--help'" in lines[0]                    # and where to read what is valid
    assert out == ""                                # nothing ran
    assert list(tmp_path.iterdir()) == []           # and nothing was written
