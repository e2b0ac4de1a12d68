"""Fuzzed command-line arguments: a usage error or a clean message, never a traceback.

Besides junk, the arguments include the bad inputs people really type (issue 15): a job file
with a syntax error, a file that is not Python, a scheduler that does not answer, a malformed
address, a store path that is a file or lies under one, a negative ``--target-stderr``, a
mistyped store, and ``demo --out`` into a missing directory. Every outcome is exit 0, 1 or 2,
at most two lines on stderr, no traceback, and nothing written in the working directory.
"""
import contextlib
import os
import tempfile

import dask
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research.cli import main
from dask_research.testing.processes import free_ports

COMMANDS = [["mc", "run"], ["mc", "pilot"], ["mc", "replay"], ["mc", "verify"], ["mc", "show"], ["demo"]]


UNREACHABLE = f"tcp://127.0.0.1:{free_ports()[0]}"
# Arguments that look like what people type, plus junk; module names that cannot import
# anything real (a leading "zz" prefix), so fuzzing never imports arbitrary installed modules.
token = st.one_of(
    st.text(alphabet="abcdefxyz0123456789-_.:/%,", min_size=0, max_size=12).map(lambda t: "zz" + t),
    st.sampled_from(["--shard", "--store", "--shards", "-k", "--json", "--seed", "--scheduler", "--verify",
                     "--target-stderr", "--no-progress", "--shards-per-task", "-1", "0", "1e309", "nan",
                     "x.py:job", "/nonexistent/store", "memory://zz", "ffff", "1,2,x", "",
                     # the paths of issue 15 (files made in the working directory by the test)
                     "broken_job.py:job", "/etc/passwd:x", "a_file", "a_file/runs", "no_such_store/",
                     UNREACHABLE, "tcp://127.0.0.1:notaport", "zz::", "htp://h:1", "--cluster", "slurm",
                     "--queue", "--jobs", "tiny_job.py:job", "tiny_job.py:job"]),
)
TINY_JOB = """
from dask_research import montecarlo as mc

def pipeline(a):
    return a * 2.0

job = mc.Job(pipeline, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1, bins=8,
             range=(-10.0, 10.0))
"""
FILES = {"broken_job.py": "import numpy as np\n\ndef pipeline(a:\n    return a\n", "a_file": "not a store",
         "tiny_job.py": TINY_JOB}


@contextlib.contextmanager
def _fresh_cwd(tmp_path):
    """A new, empty working directory under ``tmp_path`` for one example (what Click's
    ``CliRunner.isolated_filesystem`` gave: Click deprecates it, 200 warnings per run)."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as cwd, contextlib.chdir(cwd):
        yield cwd


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(COMMANDS), st.lists(token, max_size=6))
def test_cli_arguments(tmp_path, command, args):
    if command == ["demo"]:
        args = args + ["--out", "/bad/dir/r.html"]      # the last --out wins: the demo never runs
    runner = CliRunner()
    with _fresh_cwd(tmp_path) as cwd, \
            dask.config.set({"research.cli.connect-timeout": "0.2s"}):
        for name, text in FILES.items():
            with open(name, "w") as f:
                f.write(text)
        before = sorted(os.listdir(cwd))
        out = runner.invoke(main, command + args, catch_exceptions=True)
        after = sorted(os.listdir(cwd))
    assert out.exit_code in (0, 1, 2), out.output
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        pytest.fail(f"{command + args} raised {out.exception!r}\n{out.output}")
    assert "Traceback" not in out.output
    assert len(out.stderr.strip().splitlines()) <= 2, (command + args, out.stderr)
    if out.exit_code != 0:      # a failed command leaves nothing half-written
        assert after == before, (command + args, "wrote", sorted(set(after) - set(before)))


def _option(flag, values):
    return st.tuples(st.just(flag), st.sampled_from(values))


# Well-formed command lines whose pieces are drawn from the bad inputs (and a few good ones), so
# the fuzz reaches the job loader, the scheduler connection and the store, not only the parser.
job_ref = st.sampled_from(["tiny_job.py:job", "broken_job.py:job", "/etc/passwd:x", "x.py:job", "tiny_job.py:nope"])
run_option = st.one_of(
    _option("--scheduler", [UNREACHABLE, "zz::", "tcp://127.0.0.1:notaport", "htp://h:1"]),
    _option("--store", ["a_file", "a_file/runs", "runs/", "memory://zz-fuzz"]),
    _option("--shards", ["0", "-1", "2", "zz"]),
    _option("--seed", ["-1", "0", "7"]),
    _option("--verify", ["-1", "0", "1"]),
    _option("--shards-per-task", ["0", "1", "3"]),
    _option("--queue", ["short"]),
    st.just(("--no-progress",)), st.just(("--json",)),
)
pilot_option = st.one_of(
    _option("--target-stderr", ["-1", "nan", "1e309", "0", "1e-3", "zz"]),
    _option("--scheduler", [UNREACHABLE, "zz::", "htp://h:1"]),
    _option("--shards", ["0", "2"]),
)
store_option = _option("--store", ["no_such_store/", "a_file", "a_file/runs", "runs/"])


@st.composite
def command_line(draw):
    kind = draw(st.sampled_from(["run", "pilot", "show", "replay", "verify"]))
    if kind in ("run", "pilot"):
        opts = draw(st.lists(run_option if kind == "run" else pilot_option, max_size=4))
        return ["mc", kind, draw(job_ref)] + [a for o in opts for a in o]
    args = ["mc", kind] + ([draw(st.sampled_from(["ffff", "0" * 64]))] if kind != "show" or draw(st.booleans()) else [])
    args += list(draw(store_option))
    if kind == "replay":
        args += ["--shard", draw(st.sampled_from(["0", "-1", "zz"]))]
    if kind != "show" and draw(st.booleans()):
        args += ["--job", draw(job_ref)]
    return args


@pytest.mark.timeout(600, method="thread")
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command_line())
def test_cli_bad_input_paths(tmp_path, args):
    runner = CliRunner()
    with _fresh_cwd(tmp_path) as cwd, \
            dask.config.set({"research.cli.connect-timeout": "0.2s"}):
        for name, text in FILES.items():
            with open(name, "w") as f:
                f.write(text)
        before = sorted(os.listdir(cwd))
        out = runner.invoke(main, args, catch_exceptions=True)
        after = sorted(os.listdir(cwd))
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        pytest.fail(f"{args} raised {out.exception!r}\n{out.output}")
    assert out.exit_code in (0, 1, 2), (args, out.output)
    assert "Traceback" not in out.output
    assert len(out.stderr.strip().splitlines()) <= 2, (args, out.stderr)
    if out.exit_code != 0:
        assert after == before, (args, "wrote", sorted(set(after) - set(before)))
