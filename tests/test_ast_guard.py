"""The guard for CPython's random ``ast.parse`` failure (python/cpython#106905), which failed a
CI run of this suite once, in Hypothesis's ``inspect.getsource`` of a state machine."""
from __future__ import annotations

import ast
import json

import pytest

from dask_research.testing import ast_guard
from dask_research.testing.processes import run_python

# A garbage collection in the middle of each parse runs a callback that parses too, as a
# finalizer formatting a traceback does on Python 3.11; count the parses that fail.
REPRODUCER = """
import ast, gc, inspect, json, pathlib, sys
from dask_research.testing import ast_guard

source = pathlib.Path(inspect.__file__).read_text()

def parse_too(phase, info):
    if phase == "start":
        ast.parse("x + 1")

def failures(parse):
    count = 0
    for _ in range(20):
        try:
            tree = parse(source)
        except SystemError as error:
            assert str(error).startswith(ast_guard.MESSAGE), error
            count += 1
        else:
            assert ast.dump(tree) == expected
    return count

expected = ast.dump(ast.parse(source))
gc.callbacks.append(parse_too)
gc.set_threshold(50)
raw = failures(ast.parse)
ast_guard.install()
guarded = failures(ast.parse)
print(json.dumps({"raw": raw, "guarded": guarded, "collecting": gc.isenabled()}))
"""


@pytest.mark.skipif(not ast_guard.affected(), reason="this CPython's ast.parse has no such bug")
def test_a_parse_that_meets_the_bug_is_parsed_again(tmp_path):
    result = run_python(REPRODUCER, tmp_path)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout.splitlines()[-1])
    assert counts["raw"] > 0, counts          # the bug is there: most raw parses fail
    assert counts["guarded"] == 0, counts     # and no guarded one does
    assert counts["collecting"], counts       # the collector runs again after each retry


def test_the_guard_leaves_other_errors_and_results_as_they_are():
    guarded = ast_guard.guard(ast.parse)
    assert ast.dump(guarded("a = [1, 2]")) == ast.dump(ast.parse("a = [1, 2]"))
    with pytest.raises(SyntaxError):
        guarded("a = [1,")

    def broken(*args, **kwargs):
        raise SystemError("something else")

    with pytest.raises(SystemError, match="something else"):
        ast_guard.guard(broken)("x")


def test_the_suite_runs_with_the_guard_where_the_bug_is():
    assert hasattr(ast.parse, "__wrapped__") == ast_guard.affected()
