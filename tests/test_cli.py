import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import dask_research
from dask_research.cli import main

JOB_FILE = textwrap.dedent("""
    import numpy as np
    from dask_research import montecarlo as mc

    def pipeline(a, b):
        return a * np.exp(b)

    job = mc.Job(pipeline, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(0.0, 0.1)},
                 shards=16, samples_per_shard=2048, seed=3, name="tiny")

    def make():
        return job

    not_a_job = 42
""")


@pytest.fixture
def job_file(tmp_path):
    p = tmp_path / "tiny_job.py"
    p.write_text(JOB_FILE)
    return str(p)


def test_version():
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and dask_research.__version__ in out.output


def test_mc_run_from_a_file_prints_the_summary_as_json(job_file):
    out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:job", "--no-progress", "--json", "--shards", "8"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["n"] == 8 * 2048 and summary["shards"] == 8
    assert abs(summary["mean"] - 1.005) < 0.01
    assert summary["linearized"]["value"] == pytest.approx(1.0)


def test_mc_run_accepts_a_factory_and_prints_a_readable_summary(job_file):
    out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:make", "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "Monte-Carlo result tiny" in out.output and "delta-method sd" in out.output


def test_mc_pilot_with_a_plan(job_file):
    out = CliRunner().invoke(main, ["mc", "pilot", f"{job_file}:job", "--target-stderr", "1e-4"])
    assert out.exit_code == 0, out.output
    assert "sigma" in out.output and "shards x 2,048" in out.output


@pytest.mark.parametrize("ref, message", [
    ("nofile.py:job", "file 'nofile.py' does not exist"),
    ("{file}", "is not MODULE:NAME"),
    ("{file}:missing", "has no attribute 'missing'"),
    ("{file}:not_a_job", "is a int, not a dask_research.montecarlo.Job"),
    ("no_such_module_xyz:job", "cannot import module 'no_such_module_xyz'"),
])
def test_bad_job_references_are_explained(job_file, ref, message):
    out = CliRunner().invoke(main, ["mc", "run", ref.format(file=job_file), "--no-progress"])
    assert out.exit_code == 2 and message in out.output


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "Monte-Carlo" in out.stdout
