"""Fuzzed command-line arguments: a usage error or a clean message, never a traceback."""
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research.cli import main

COMMANDS = [["mc", "run"], ["mc", "pilot"], ["mc", "replay"], ["mc", "verify"], ["mc", "show"]]
# Arguments that look like what people type, plus junk; module names that cannot import
# anything real (a leading "zz" prefix), so fuzzing never imports arbitrary installed modules.
token = st.one_of(
    st.text(alphabet="abcdefxyz0123456789-_.:/%,", min_size=0, max_size=12).map(lambda t: "zz" + t),
    st.sampled_from(["--shard", "--store", "--shards", "-k", "--json", "--seed", "--scheduler", "--verify",
                     "--target-stderr", "--no-progress", "--shards-per-task", "-1", "0", "1e309", "nan",
                     "x.py:job", "/nonexistent/store", "memory://zz", "ffff", "1,2,x", ""]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(COMMANDS), st.lists(token, max_size=6))
def test_cli_arguments(tmp_path, command, args):
    out = CliRunner().invoke(main, command + args, catch_exceptions=True)
    assert out.exit_code in (0, 1, 2), out.output
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        pytest.fail(f"{command + args} raised {out.exception!r}\n{out.output}")
    assert "Traceback" not in out.output
