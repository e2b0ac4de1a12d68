"""The command line against a real ``dask scheduler`` with separate ``dask worker`` processes.

The workers run in a directory of their own, so the job file, and the modules next to it, can
reach them only by value (issue 15). Results must be bit-identical to the embedded run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from .conftest import REPO

CLI = [sys.executable, "-m", "dask_research.cli"]
# The README's command (``dask-research mc run examples/saturating_pipeline.py:job --store runs/``,
# plus ``--scheduler``), with fewer shards so that it is quick on a small machine.
README_RUN = "mc run examples/saturating_pipeline.py:job --store runs/".split()
SMALL = ["--shards", "24", "--no-progress", "--json"]
# Summary fields that are functions of the accumulated state: equal floats (JSON keeps every
# bit of a float) mean the same bits; the percentile interval reads the histogram.
STATE_FIELDS = ["n", "mean", "sd", "stderr", "skewness", "kurtosis", "min", "max",
                "output_interval95_percentile", "underflow", "overflow"]


def cli(args, cwd, timeout=240):
    out = subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ))
    return out


def _state(summary: dict) -> dict:
    return {k: summary[k] for k in STATE_FIELDS}


@pytest.mark.timeout(300, method="thread")
def test_the_readme_command_runs_on_a_real_scheduler_bit_identical_to_the_embedded_run(dask_processes, tmp_path):
    (tmp_path / "examples").mkdir()
    shutil.copy(os.path.join(REPO, "examples", "saturating_pipeline.py"), tmp_path / "examples")
    remote = cli(README_RUN + ["--scheduler", dask_processes] + SMALL, tmp_path)
    assert remote.returncode == 0, remote.stderr[-3000:]
    remote_summary = json.loads(remote.stdout)
    assert len(remote_summary["workers"]) == 2        # it ran on the two worker processes
    assert all(not c["same_worker"] for c in remote_summary["verification"]["checked"])

    local = cli(["mc", "run", "examples/saturating_pipeline.py:job", "--store", "runs-embedded/"] + SMALL, tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    local_summary = json.loads(local.stdout)
    assert remote_summary["run_id"] == local_summary["run_id"]
    assert _state(remote_summary) == _state(local_summary)

    show = cli(["mc", "show", remote_summary["run_id"][:12], "--store", "runs/"], tmp_path)
    assert show.returncode == 0, show.stderr
    n = len(remote_summary["verification"]["checked"])
    assert f"verified {n} shards re-run, all match: {n} on another worker than the one that computed them" in show.stdout

    pilot = cli(["mc", "pilot", "examples/saturating_pipeline.py:job", "--target-stderr", "1e-4",
                 "--scheduler", dask_processes], tmp_path)
    assert pilot.returncode == 0, pilot.stderr[-3000:]
    assert "sigma" in pilot.stdout and "2 threads" in pilot.stdout, pilot.stdout


SIBLING = textwrap.dedent('''
    import numpy as np

    OFFSET = 0.25

    def shift(x):
        return x + OFFSET

    def sibling_pipeline(a, b):
        return shift(a) * np.exp(b)
''')

JOB_WITH_HELPERS = textwrap.dedent('''
    import numpy as np
    from dask_research import montecarlo as mc

    import sibling_helpers
    from sibling_helpers import shift

    SCALE = 3.0

    def square(x):
        return x * x

    def pipeline(a, b):
        return square(shift(a)) * SCALE + np.tanh(b)

    inputs = {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(0.0, 0.5)}
    job = mc.Job(pipeline, inputs, shards=12, samples_per_shard=4096, seed=11, bins=32)
    job_from_sibling = mc.Job(sibling_helpers.sibling_pipeline, inputs, shards=12,
                              samples_per_shard=4096, seed=12, bins=32)
''')


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("name", ["job", "job_from_sibling"])
def test_helpers_in_the_file_and_sibling_modules_travel_by_value(dask_processes, tmp_path, name):
    project = tmp_path / "project"
    project.mkdir()
    (project / "sibling_helpers.py").write_text(SIBLING)
    (project / "job_with_helpers.py").write_text(JOB_WITH_HELPERS)
    ref = f"project/job_with_helpers.py:{name}"
    remote = cli(["mc", "run", ref, "--scheduler", dask_processes, "--no-progress", "--json"], tmp_path)
    assert remote.returncode == 0, remote.stderr[-3000:]
    local = cli(["mc", "run", ref, "--no-progress", "--json"], tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    remote_summary, local_summary = json.loads(remote.stdout), json.loads(local.stdout)
    # Every shard was computed by the worker processes, which cannot import the job's modules
    # (how the scheduler spread 12 shards over the two is not the point, and on a busy machine
    # one worker may take them all).
    assert sum(remote_summary["workers"].values()) == 12 and remote_summary["workers"], remote_summary["workers"]
    assert _state(remote_summary) == _state(local_summary)
    # The content address is the one the file has when imported the ordinary way.
    imported = subprocess.run([sys.executable, "-c", f"import job_with_helpers as m; print(m.{name}.id)"],
                              cwd=project, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert imported.returncode == 0, imported.stderr
    assert remote_summary["run_id"] == imported.stdout.strip()
