import json
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import dask_research
from dask_research.cli import main
from dask_research.testing.processes import free_ports

JOB_FILE = textwrap.dedent("""
    import numpy as np
    from dask_research import montecarlo as mc
    from dask_research.montecarlo.job import job_factory

    def pipeline(a, b):
        return a * np.exp(b)

    job = mc.Job(pipeline, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(0.0, 0.1)},
                 shards=16, samples_per_shard=2048, seed=3, name="tiny")

    @job_factory
    def make():
        return job

    def main():
        open(__file__ + ".ran", "w").write("main ran")
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
    ("{file}:not_a_job", "is an int, not a dask_research.montecarlo.Job"),
    ("{file}:pipeline", "is a function pipeline(a, b), not a dask_research.montecarlo.Job"),
    ("no_such_module_xyz:job", "cannot import module 'no_such_module_xyz'"),
])
def test_bad_job_references_are_explained(job_file, ref, message):
    out = CliRunner().invoke(main, ["mc", "run", ref.format(file=job_file), "--no-progress"])
    assert out.exit_code == 2 and message in out.output


def test_a_misspelt_job_name_gets_the_closest_name_and_not_the_imported_modules(job_file):
    out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:jobb", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert "has no attribute 'jobb' (did you mean 'job'?)" in out.output
    offered = out.output.split("; it has ", 1)[1]
    assert "'job'" in offered and "'pipeline'" in offered
    assert "'np'" not in offered and "'mc'" not in offered, offered


def test_an_unmarked_function_is_refused_before_it_runs(job_file):
    """``FILE:main`` (a slip for ``:job``) was called, running a whole job; now one line, nothing run."""
    import os

    out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:main", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert len(out.output.strip().splitlines()) == 1
    assert "is a function main(), not a dask_research.montecarlo.Job" in out.output and "@" in out.output
    assert not os.path.exists(job_file + ".ran")


def test_a_job_file_that_exits_parses_argv_or_loops_at_import_gets_one_line(tmp_path):
    """sys.exit at import (argparse's usage) and an import that never ends are one line naming
    the file (exit 2); the file sees none of the CLI's arguments; --traceback shows the cause."""
    import dask

    exits = tmp_path / "exits_job.py"
    exits.write_text("import argparse\nap = argparse.ArgumentParser()\nap.add_argument('--out', required=True)\n"
                     "ap.parse_args()\n")
    out = CliRunner().invoke(main, ["mc", "run", f"{exits}:job", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert len(out.output.strip().splitlines()) == 1
    assert f"importing {exits} called sys.exit(2)" in out.output and "__main__" in out.output
    parses = tmp_path / "parses_job.py"          # parses argv at import, no required argument: it loads
    parses.write_text(JOB_FILE + "\nimport argparse, sys\nARGV = list(sys.argv)\nargparse.ArgumentParser().parse_args()\n")
    out = CliRunner().invoke(main, ["mc", "pilot", f"{parses}:job"])
    assert out.exit_code == 0, out.output
    loops = tmp_path / "loops_job.py"
    loops.write_text("while True:\n    pass\n")
    with dask.config.set({"research.cli.import-timeout": "1s"}):
        out = CliRunner().invoke(main, ["mc", "run", f"{loops}:job", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert f"importing {loops} did not finish within 1 s (research.cli.import-timeout)" in out.output
    fails = tmp_path / "fails_job.py"
    fails.write_text("def helper():\n    raise ValueError('deep inside')\nhelper()\n")
    out = CliRunner().invoke(main, ["--traceback", "mc", "run", f"{fails}:job", "--no-progress"])
    assert out.exit_code == 2 and "Traceback" in out.output and "in helper" in out.output, out.output
    assert out.output.strip().splitlines()[-1].startswith("Error: Invalid value for MODULE:JOB: loading")


@pytest.mark.timeout(300, method="thread")
def test_what_a_job_file_prints_at_import_never_corrupts_json_output(tmp_path):
    """A print() at import went to stdout, before the summary: `--json` output no longer parsed."""
    job = tmp_path / "chatty_job.py"
    job.write_text("print('loading the chatty job')\n" + JOB_FILE)
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run", f"{job}:job", "--no-progress",
                          "--json", "--shards", "4"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["shards"] == 4
    assert "loading the chatty job" in out.stderr


@pytest.mark.timeout(120, method="thread")
def test_a_job_file_that_calls_os_exit_at_import_is_one_line_not_a_silent_success(tmp_path):
    job = tmp_path / "quits_job.py"
    job.write_text("import os\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run", f"{job}:job", "--no-progress"],
                         capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout + out.stderr)[-3000:]
    assert f"importing {job} called os._exit(0)" in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("body", [
    "import time\nwhile True:\n    try:\n        time.sleep(1)\n    except BaseException:\n        pass\n",
    "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
], ids=["catches the timeout", "ignores SIGALRM"])
def test_a_job_file_that_swallows_the_import_timeout_is_still_named(tmp_path, body):
    """A file whose loop catches everything (``except BaseException``, a bare ``except:``) or that
    replaces SIGALRM's handler swallowed research.cli.import-timeout: the command waited forever.
    Past the timeout and a grace of seconds it is one usage line (exit 2)."""
    import os
    import time

    loops = tmp_path / "swallows_job.py"
    loops.write_text(body)
    env = dict(os.environ, DASK_RESEARCH__CLI__IMPORT_TIMEOUT="1s")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run", f"{loops}:job", "--no-progress"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert time.monotonic() - start < 30
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"Error: Invalid value for MODULE:JOB: importing {loops} did not finish within 1 s "
                               "(research.cli.import-timeout)") and "mc run --help'" in lines[0], lines[0]
    assert out.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["swallows_job.py"]


@pytest.mark.parametrize("key", ["import-timeout", "connect-timeout"])
@pytest.mark.parametrize("value", ["abc", -5])
def test_a_malformed_cli_timeout_is_named_as_the_setting(job_file, key, value):
    """``research.cli.import-timeout: abc`` was blamed on the job file ("loading ... failed:
    KeyError: 'Invalid time unit: abc. Valid units are: s, ms, ...'", exit 2) and -5 meant no
    bound; ``connect-timeout: abc`` was that KeyError as a run failure. One line naming the key."""
    import dask

    port = free_ports()[0]
    with dask.config.set({f"research.cli.{key}": value}):
        out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:job", "--no-progress", "--shards", "1",
                                        "--scheduler", f"tcp://127.0.0.1:{port}"])
    assert out.exit_code == 1, out.output
    assert out.output.strip().splitlines() == [
        f"Error: config research.cli.{key}={value!r} is invalid; expected a duration such as \"60s\", or seconds >= 0"]


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_demo_refuses_a_report_path_that_is_a_link_or_a_fifo_before_it_runs(tmp_path, kind):
    """``demo --out`` on a symbolic link or a FIFO ran the whole demo (cluster, store, three
    capabilities) and only then failed writing the report (exit 1): now one usage line first."""
    import os

    pytest.importorskip("bokeh")
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    out_path = tmp_path / "r.html"
    if kind == "link":
        out_path.symlink_to(victim)
    else:
        os.mkfifo(out_path)
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out_path), "--store", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    what = "a symbolic link" if kind == "link" else "not a regular file"
    assert result.output.strip().splitlines() == [
        f"Error: Invalid value for --out: '{out_path}' is {what}; expected a regular file or a new path for the HTML "
        "report (a link is never followed) (see 'main demo --help')"]
    assert victim.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "r.html"]


_IMPORTS_AFTER = """
import sys
sys.argv = ["dask-research", *sys.argv[1:]]
from dask_research.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("distributed", "torch", "bokeh")
               or m.startswith(("dask_research.montecarlo", "dask_research.experiments", "dask_research.replay")))
print(code, len(heavy), heavy[:3], file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["mc", "run", "--shards", "0", "x.py:job"],
                                  ["mc", "run", "--help"], ["mc", "nope"]])
def test_help_version_and_argument_errors_import_neither_distributed_nor_a_capability(args):
    """``--help`` took 6.6-11 s importing distributed and the Monte-Carlo stack; a command's
    imports now happen when it runs (checked by what is in sys.modules, not by a time)."""
    out = subprocess.run([sys.executable, "-c", _IMPORTS_AFTER, *args], capture_output=True, text=True,
                         timeout=120)
    code, n_heavy, _ = out.stderr.strip().splitlines()[-1].split(" ", 2)
    assert code in ("0", "2") and n_heavy == "0", out.stderr


def test_typed_values_are_checked_before_anything_runs(job_file):
    """``--shards-per-task 3`` failed 24 s later as a run failure (exit 1); ``--target-stderr
    1e-300`` printed OverflowError. Both are one usage line (exit 2)."""
    out = CliRunner().invoke(main, ["mc", "run", f"{job_file}:job", "--shards-per-task", "3", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert "Invalid value for '--shards-per-task': '3' is not a power of two (e.g. 2 or 4)" in out.output
    out = CliRunner().invoke(main, ["mc", "pilot", f"{job_file}:job", "--target-stderr", "1e-300"])
    assert out.exit_code == 2, out.output
    assert "OverflowError" not in out.output and "1e-300 is out of reach" in out.output
    assert out.output.strip().splitlines()[-1].startswith("Error: Invalid value for --target-stderr: ")


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
def test_a_late_nan_is_one_line_without_dask_s_compute_failed_log(tmp_path):
    """A NaN in shard 22 (the pilot is clean) printed Dask's 6-line "Compute Failed" worker log first."""
    job = tmp_path / "nan_job.py"
    job.write_text(textwrap.dedent("""
        import numpy as np
        from dask_research import montecarlo as mc

        def late_nan(a):
            return np.where(a > 4.0, np.nan, a)

        job = mc.Job(late_nan, {"a": mc.Normal(0.0, 1.0)}, shards=32, samples_per_shard=4096, seed=1,
                     range=(-6.0, 6.0))
    """))
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run", f"{job}:job", "--no-progress"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "Compute Failed" not in out.stderr, out.stderr
    assert "ended with CancelledError" not in out.stderr, out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.strip() and "warn" not in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith("Error: pipeline output of shard "), out.stderr


def test_the_worker_command_loads_when_it_is_asked_for():
    help_text = CliRunner().invoke(main, ["--help"]).output
    assert "worker  Run `dask worker SCHEDULER` with the own-device power policy." in help_text
    out = CliRunner().invoke(main, ["worker", "--help"])
    assert out.exit_code == 0 and "--battery-floor" in out.output


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "Monte-Carlo" in out.stdout


# -- bad input at the command line: one line, exit 2 (what was typed) or 1 (while running) -----
EXAMPLE = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "saturating_pipeline.py")


def _bad_input_cases(tmp_path):
    syntax = tmp_path / "broken_job.py"
    syntax.write_text("import numpy as np\n\ndef pipeline(a:\n    return a\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a store")
    port = free_ports()[0]
    job = f"{EXAMPLE}:job"
    small = ["--shards", "2", "--no-progress"]
    return {
        "syntax error in the job file": (["mc", "run", f"{syntax}:job"], 2, f"{syntax}, line 3: syntax error"),
        "unreachable scheduler": (["mc", "run", job, "--scheduler", f"tcp://127.0.0.1:{port}"], 1,
                                  f"cannot reach the scheduler at tcp://127.0.0.1:{port}"),
        "malformed scheduler address": (["mc", "run", job, "--scheduler", "tcp://127.0.0.1:notaport"], 2,
                                        "'tcp://127.0.0.1:notaport' is not a scheduler address"),
        "unknown scheduler protocol": (["mc", "pilot", job, "--target-stderr", "1e-3", "--scheduler", "htp://h:1"],
                                       2, "unknown protocol 'htp'"),
        "store is a file": (["mc", "run", job, "--store", str(a_file)] + small, 2,
                            f"'{a_file}' is a file, not a run store"),
        "store cannot be created": (["mc", "run", job, "--store", str(a_file / "runs")] + small, 2,
                                    f"'{a_file / 'runs'}' cannot be created: {a_file} is a file"),
        "negative target stderr": (["mc", "pilot", job, "--target-stderr", "-1"], 2,
                                   "'-1' is invalid; expected a finite number above 0"),
        "demo into a missing directory": (["demo", "--out", "/bad/dir/r.html"], 2,
                                          "(/bad/dir does not exist)"),
        "demo store is a file": (["demo", "--quick", "--store", str(a_file / "store")], 2,
                                 f"a folder for the run store ({a_file} is a file)"),
        "not a python file": (["mc", "run", "/etc/passwd:x"], 2, "'/etc/passwd' is not a Python file"),
        "mistyped store for show": (["mc", "show", "--store", str(tmp_path / "runz")], 2, "does not exist"),
    }


CASES = ["syntax error in the job file", "unreachable scheduler", "malformed scheduler address",
         "unknown scheduler protocol", "store is a file", "store cannot be created", "negative target stderr",
         "demo into a missing directory", "demo store is a file", "not a python file", "mistyped store for show"]


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_and_the_right_exit_code(tmp_path, case):
    """The real console command (a process): one line on stderr naming the bad value, no traceback,
    exit 2 for what was typed and 1 for what failed while running, and nothing written."""
    import os

    args, code, message = _bad_input_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    env = dict(os.environ, DASK_RESEARCH__CLI__CONNECT_TIMEOUT="0.5s")
    out = subprocess.run([sys.executable, "-m", "dask_research.cli", *args], capture_output=True, text=True,
                         timeout=100, cwd=tmp_path, env=env)
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr + out.stdout
    assert len(lines) == 1, out.stderr
    assert out.returncode == code, out.stderr
    assert message in lines[0], lines[0]
    assert out.stdout == ""                       # nothing ran: the demo is refused before it starts
    assert sorted(p.name for p in tmp_path.iterdir()) == before     # and nothing was written


def test_traceback_flag_shows_the_full_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from dask_research import montecarlo as mc\n\n\ndef pipe(a):\n    raise ValueError('no')\n\n\n"
                      "job = mc.Job(pipe, {'a': mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1)\n")
    args = ["mc", "run", f"{broken}:job", "--no-progress"]
    short = CliRunner().invoke(main, args)
    assert short.exit_code == 1 and "Traceback" not in short.output
    full = CliRunner().invoke(main, ["--traceback", *args])
    assert full.exit_code == 1 and full.exception is not None and not isinstance(full.exception, SystemExit)


def test_show_says_where_verification_ran_from_the_record():
    from dask_research.montecarlo.result import verification_sentence

    same = [{"shard": s, "producer": "w", "verifier": "w", "same_worker": True, "match": True} for s in range(4)]
    one = {"verification": {"checked": same}, "workers": ["w"], "computed_shards": 16, "reused_shards": 0}
    assert verification_sentence(one) == (
        "4 shards re-run, all match: 4 on the same worker that computed them, the only worker that ran this job")
    mixed = same[:1] + [dict(c, verifier="v", same_worker=False) for c in same[1:]]
    two = {"verification": {"checked": mixed, "quarantined_workers": ["x"]}, "workers": ["w", "v"],
           "computed_shards": 16, "reused_shards": 0}
    assert verification_sentence(two) == ("4 shards re-run, all match: 3 on another worker than the one that "
                                          "computed them; 1 on the same worker that computed them; quarantined x")
    resumed = dict(one, computed_shards=0, reused_shards=16)
    assert verification_sentence(resumed) == (
        "4 shards re-run, all match: 4 stored by an earlier run, recomputed on this cluster")


def test_show_of_an_embedded_run_does_not_claim_other_workers(job_file, tmp_path):
    store = str(tmp_path / "store")
    run = CliRunner().invoke(main, ["mc", "run", f"{job_file}:job", "--no-progress", "--json", "--store", store])
    assert run.exit_code == 0, run.output
    summary = json.loads(run.output)
    n = len(summary["verification"]["checked"])
    assert all(c["same_worker"] for c in summary["verification"]["checked"])     # one embedded worker
    show = CliRunner().invoke(main, ["mc", "show", summary["run_id"], "--store", store])
    assert show.exit_code == 0, show.output
    assert f"verified {n} shards re-run, all match: {n} on the same worker that computed them" in show.output
    assert "on other workers" not in show.output and "another worker" not in show.output
    # The mean is shown with its 95 % CI, labelled, never a bare "+- stderr".
    # The same line as the run's own summary prints (one formatter: result.mean_text).
    from dask_research.montecarlo.result import mean_text

    line = mean_text(summary["mean"], summary["stderr"])
    assert f"mean {line}" in show.output and "+-" not in show.output
    assert "95 % CI of the mean [" in line
    # Run it again: the same sentence as the run itself prints for a resumed run.
    again = CliRunner().invoke(main, ["mc", "run", f"{job_file}:job", "--no-progress", "--store", store])
    assert again.exit_code == 0 and "stored by an earlier run, recomputed on this cluster" in again.output
    assert f"{store}/runs/{summary['run_id']}" in again.output


def test_a_job_file_is_shipped_by_value_and_only_its_siblings_with_it(tmp_path, monkeypatch):
    """The job file and the modules next to it leave sys.modules (so Dask pickles their code by
    value); libraries it imports, from a virtual environment inside the project too, stay."""
    import pickle

    import cloudpickle

    from dask_research.cli import load_object

    project = tmp_path / "project"
    (project / "venv_site" / "libpkg").mkdir(parents=True)
    (project / "venv_site" / "libpkg" / "__init__.py").write_text("def lib_fn(x):\n    return x\n")
    (project / "localpkg").mkdir()
    (project / "localpkg" / "__init__.py").write_text("")
    (project / "localpkg" / "tools.py").write_text("def twice(x):\n    return 2 * x\n")
    (project / "job.py").write_text(textwrap.dedent("""
        import libpkg
        from localpkg.tools import twice
        from dask_research import montecarlo as mc

        def pipeline(a):
            return libpkg.lib_fn(twice(a))

        job = mc.Job(pipeline, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8)
    """))
    monkeypatch.syspath_prepend(str(project / "venv_site"))     # like a project's .venv
    before = set(sys.modules)
    job = load_object(f"{project / 'job.py'}:job")
    new = set(sys.modules) - before
    assert "libpkg" in new                                          # a library: stays importable
    assert not any(n.startswith(("localpkg", "_dask_research_user_")) for n in new)
    assert not (project / "__pycache__").exists()                   # nothing written next to the job
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(job.pipeline)                                  # so Dask falls back to cloudpickle,
    blob = cloudpickle.dumps(job.pipeline)                          # which sends the code itself
    assert b"twice" in blob and job.pipeline(3.0) == 6.0
    sys.modules.pop("libpkg", None)


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_says_what_is_stored_and_that_the_same_command_resumes(tmp_path, signame):
    """A real ``dask-research mc run`` process interrupted with SIGINT mid-run: one line that says
    how many shards are stored and that the same command resumes; then it does. SIGTERM (``kill``,
    a batch system's cancel) does the same: it killed the process silently and left its lease for
    the next run to take over with a warning; and Dask's "Async instruction ... ended with
    CancelledError" warnings of the cancelled tasks came before the line."""
    import os
    import signal
    import time

    job_file = tmp_path / "slow_job.py"
    job_file.write_text(textwrap.dedent("""
        import time
        import numpy as np
        from dask_research import montecarlo as mc

        def slow(a):
            time.sleep(0.05)
            return np.tanh(a)

        job = mc.Job(slow, {"a": mc.Normal(0.0, 1.0)}, shards=256, samples_per_shard=64, seed=3)
    """))
    store = tmp_path / "runs"
    cmd = [sys.executable, "-m", "dask_research.cli", "mc", "run", f"{job_file}:job", "--store", str(store),
           "--no-progress", "--verify", "0", "--shards-per-task", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(store.glob("runs/*/shards/*.json")):
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(getattr(signal, signame))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + getattr(signal, signame), err   # 130 / 143: interrupted, not failed (1)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(store.glob("runs/*/lease.json"))          # the lease is released
    m = re.search(r"interrupted: (\d+) of 256 shards are stored in .*; the same command resumes", err)
    assert m and 0 < int(m.group(1)) < 256, err
    again = subprocess.run(cmd + ["--json"], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                           env=dict(os.environ))
    assert again.returncode == 0, again.stderr
    assert "taking over the lease" not in again.stderr
    assert json.loads(again.stdout)["reused_shards"] >= int(m.group(1))


def test_the_store_layout_is_the_one_getting_started_describes(job_file, tmp_path):
    """``--store runs/`` keeps each run in ``runs/runs/<run id>/`` and the command prints that
    path; getting-started said everything went to ``runs/<run id>/`` (issue 29): one layout,
    described as it is."""
    import pathlib

    out = subprocess.run([sys.executable, "-m", "dask_research.cli", "mc", "run", f"{job_file}:job", "--store",
                          "runs/", "--no-progress", "--shards", "4"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("stored")]
    path = line.split()[-1]
    assert re.fullmatch(r"runs/runs/[0-9a-f]{64}", path), line
    assert (tmp_path / path / "manifest.json").is_file() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["runs"]
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "getting-started.rst").read_text()
    assert "``runs/runs/<run id>/``" in page and "``stored runs/runs/...``" in page


def test_a_run_made_with_shards_and_seed_overrides_verifies_and_replays_from_the_same_job_file(job_file, tmp_path):
    """``mc run FILE:job --shards 4 --seed 9`` runs another job than the file's (16 shards, seed 3);
    ``mc verify``/``mc replay`` with the same ``--job FILE:job`` took the file's job and refused the
    run as "not the one that ran" (issue 29's walk). The recorded shard count and seed are taken
    from the manifest; the pipeline and inputs must still be the caller's."""
    cli = [sys.executable, "-m", "dask_research.cli"]
    run = subprocess.run(cli + ["mc", "run", f"{job_file}:job", "--store", "s", "--no-progress", "--shards", "4",
                                "--seed", "9"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run_id = run.stdout.split("stored")[-1].strip().rsplit("/", 1)[-1]
    verify = subprocess.run(cli + ["mc", "verify", run_id[:12], "--store", "s", "--job", f"{job_file}:job", "-k", "2"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "2 of 2 shards reproduced exactly" in verify.stdout
    replay = subprocess.run(cli + ["mc", "replay", run_id[:12], "--shard", "3", "--store", "s", "--job",
                                   f"{job_file}:job"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    # another pipeline in the same file is still refused: only the shard count and seed are taken
    other = pathlib.Path(job_file).with_name("other_job.py")
    other.write_text(JOB_FILE.replace("a * np.exp(b)", "a * np.exp(b) + 1"))
    wrong = subprocess.run(cli + ["mc", "verify", run_id[:12], "--store", "s", "--job", f"{other}:job", "-k", "1"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert wrong.returncode != 0 and "is not the one that ran" in wrong.stdout + wrong.stderr


@pytest.mark.parametrize("args, said", [
    (["mc", "replay", "{file}:job", "--shard", "abc"], "'abc' is not a whole number (expected one >= 0)"),
    (["mc", "run", "{file}:job", "--shards", "2.5"], "'2.5' is not a whole number (expected one >= 1)"),
    (["mc", "verify", "{file}:job", "-k", "x"], "'x' is not a whole number (expected one >= 1)"),
])
def test_a_number_option_given_a_word_says_a_whole_number_was_expected(job_file, args, said):
    """Click's wording ("is not a valid integer range") named a type nobody typed."""
    out = CliRunner().invoke(main, [a.format(file=job_file) for a in args])
    assert out.exit_code == 2, out.output
    assert said in out.output and "integer range" not in out.output
