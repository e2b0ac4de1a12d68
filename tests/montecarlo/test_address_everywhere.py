"""One content address for one pipeline, wherever it is defined (issue 28).

The same source run as a script, typed into ``python -i``, run in a notebook cell (a real
Jupyter kernel) and imported as a module gives the same ``job.id``: the address hashes the
pipeline's code object and what it reads, not its source text (which a console cannot show)
nor where it was compiled. A one-token change in a body gives another id; a comment, a
docstring, the function's place in its file, ``from __future__`` imports and the compilation
unit do not. Scheme 1 (source text) gave the console another id than the script.
"""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError, StoreError
from dask_research.montecarlo.address import BYTECODE, SCHEME, code_identity, pipeline_fingerprint, scheme_of
from dask_research.testing.processes import subprocess_env

#: Pipelines as a user writes them: the README's taste, helpers, module constants (a set, so
#: the string hash seed matters), a comprehension, a lambda, a keyword-only default, a closure,
#: an assert, a user reducer class and method calls on an imported module. Written so that
#: ``python -i`` reads it as typed (no blank line inside a block).
SOURCE = '''\
import numpy as np
from dask_research import montecarlo as mc
SCALE = 2.0
WEIGHTS = np.array([0.25, 0.75])
LABELS = {"low", "high", "mid"}
def ratio(a, b, c):
    """The README's taste."""
    return a * b / (c + 1)  # vectorised: arrays in, array out

def helper(x):
    return np.tanh(x) * SCALE

def rich(a, b, *, k=3):
    parts = [helper(v) for v in (a, b) if "low" in LABELS]
    return (lambda u, w: WEIGHTS[0] * u + WEIGHTS[1] * w)(*parts) + k

def make(offset):
    def shifted(a):
        return a + offset
    return shifted

def checked(a):
    assert a.ndim == 1, "one array per input"
    return a * 2

class Total:
    def init(self):
        return {"n": 0, "s": 0.0}
    def update(self, state, y):
        return {"n": state["n"] + len(y), "s": state["s"] + float(np.sum(y))}
    def merge(self, p, q):
        return {"n": p["n"] + q["n"], "s": p["s"] + q["s"]}
    def finalize(self, state):
        return state["s"] / state["n"]

'''

#: The jobs whose ids are compared, and a workout of their pipelines (CPython specializes code
#: that runs often: the address must not see it).
JOBS = '''\
def ids():
    ins = {"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.7, 0.15), "c": mc.Uniform(0.4, 0.6)}
    jobs = {"taste": mc.Job(ratio, ins, shards=64, samples_per_shard=65_536, seed=2026),
            "rich": mc.Job(rich, {"a": ins["a"], "b": ins["b"]}, shards=4, samples_per_shard=64, seed=1),
            "closure": mc.Job(make(0.5), {"a": ins["a"]}, shards=4, samples_per_shard=64, seed=1),
            "reduced": mc.Job(ratio, ins, shards=4, samples_per_shard=64, seed=1, reducer=Total()),
            "checked": mc.Job(checked, {"a": ins["a"]}, shards=4, samples_per_shard=64, seed=1)}
    return " ".join(f"{k}={j.id}" for k, j in sorted(jobs.items()))

def exercise():
    x = np.linspace(0.1, 1.0, 8)
    for _ in range(300):
        ratio(x, x, x), rich(x, x), make(0.5)(x), checked(x)

'''

PRINT = '''\
print("IDS", ids())
exercise()
print("IDS", ids())
'''

#: Edits that keep what every pipeline computes: moved down the file, comments and the
#: docstring changed, a ``__future__`` import (another compiler flag).
MOVED = ("from __future__ import annotations\n# a new first comment\n\n\n"
         + SOURCE.replace("# vectorised: arrays in, array out", "# another comment")
                 .replace("The README's taste.", "Another docstring, longer than the first one."))
#: One token changed in the taste's body: ``c + 1`` -> ``c + 2``.
CHANGED = SOURCE.replace("a * b / (c + 1)", "a * b / (c + 2)")
#: A module constant a helper reads (only inside a comprehension, through ``helper``).
CONSTANT = SOURCE.replace("SCALE = 2.0", "SCALE = 2.5")

ROOT = str(Path(mc.__file__).resolve().parents[2])


def _ids(output: str) -> dict[str, str]:
    lines = [line.split("IDS ", 1)[1] for line in output.splitlines() if "IDS " in line]
    assert len(lines) == 2, output
    first, again = (dict(kv.split("=") for kv in line.split()) for line in lines)
    assert first == again, "running the pipelines changed their addresses"
    assert sorted(first) == ["checked", "closure", "reduced", "rich", "taste"]
    return first


def _env(seed: int) -> dict[str, str]:
    env = subprocess_env()
    env["PYTHONHASHSEED"] = str(seed)        # another string hash order in each process
    return env


def _run(args: list[str], cwd: Path, seed: int, stdin: str | None = None) -> str:
    out = subprocess.run(args, cwd=cwd, env=_env(seed), input=stdin, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def script(tmp: Path, source: str = SOURCE, *flags: str, seed: int = 1) -> dict[str, str]:
    """``python [flags] pipelines.py`` in a fresh directory."""
    path = tmp / f"script_{seed}.py"
    path.write_text(source + JOBS + PRINT)
    return _ids(_run([sys.executable, *flags, path.name], tmp, seed))


def console(tmp: Path, source: str = SOURCE, seed: int = 2) -> dict[str, str]:
    """The same text typed into ``python -i`` (a real interpreter reading its stdin)."""
    return _ids(_run([sys.executable, "-i", "-q"], tmp, seed, stdin=source + JOBS + PRINT))


def module(tmp: Path, source: str = SOURCE, seed: int = 3) -> dict[str, str]:
    """The text saved as a module and imported by another program."""
    (tmp / "taste_pipelines.py").write_text(source + JOBS)
    return _ids(_run([sys.executable, "-c", "from taste_pipelines import *\n" + PRINT], tmp, seed))


def notebook(tmp: Path) -> list[dict[str, str]]:
    """The text in notebook cells run by a real Jupyter kernel: once with the imports in the
    same cell as the functions, once with them in a cell before and a top-level ``await`` in
    the functions' cell (IPython compiles such a cell with other flags)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    imports, rest = SOURCE.split("SCALE = 2.0", 1)
    cells = [f"import sys\nsys.path.insert(0, {ROOT!r})", SOURCE, JOBS, PRINT,
             imports, "import asyncio\nawait asyncio.sleep(0)\nSCALE = 2.0" + rest, JOBS, PRINT]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=180, startup_timeout=180,
                                     resources={"metadata": {"path": str(tmp)}})
    client.execute()
    printed = ["".join(o.get("text", "") for o in nb.cells[i].outputs if o.get("output_type") == "stream")
               for i in (3, 7)]
    return [_ids(p) for p in printed]


@pytest.mark.timeout(600, method="thread")
def test_one_pipeline_has_one_address_in_a_script_a_console_a_notebook_and_a_module(tmp_path):
    from_script = script(tmp_path)
    assert console(tmp_path) == from_script    # scheme 1 did not: README taste 642ee9f0df13 vs 0cbf9b761fff
    assert module(tmp_path) == from_script
    same_cell, other_cells = notebook(tmp_path)
    assert same_cell == from_script and other_cells == from_script


RUN = """\
job = mc.Job(ratio, {{"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.7, 0.15), "c": mc.Uniform(0.4, 0.6)}},
             shards=8, samples_per_shard=4096, seed=2026)
result = mc.run(job, store={store!r}, progress=False)
print("RUN", result.run_id, result.reused_shards, result.computed_shards, result.mean.hex())
print("REPLAY", mc.replay(result.run_id, 5, {store!r}).match)
"""


@pytest.mark.timeout(600, method="thread")
def test_a_run_typed_into_a_console_is_resumed_by_the_script(tmp_path):
    """The user's path: a run computed in ``python -i`` is found whole by the script (nothing
    computed again), and replays there; scheme 1 computed it all again under another id."""
    run = RUN.format(store=str(tmp_path / "runs"))

    def ran(output: str) -> tuple[list[str], str]:
        fields = [line.split() for line in output.splitlines() if line.lstrip(">. ").startswith(("RUN", "REPLAY"))]
        return [f[1:] for f in fields if "RUN" in f[0]][0], [f[1] for f in fields if "REPLAY" in f[0]][0]

    (typed, typed_replay) = ran(_run([sys.executable, "-i", "-q"], tmp_path, 11, stdin=SOURCE + run))
    (tmp_path / "resume.py").write_text(SOURCE + run)
    (again, again_replay) = ran(_run([sys.executable, "resume.py"], tmp_path, 12))
    assert typed[1:3] == ["0", "8"] and typed_replay == "True"
    assert again[0] == typed[0] and again[1:3] == ["8", "0"] and again[3] == typed[3] and again_replay == "True"


@pytest.mark.timeout(600, method="thread")
def test_an_edit_that_changes_what_it_computes_changes_the_address_and_no_other(tmp_path):
    base = script(tmp_path)
    assert script(tmp_path, MOVED, seed=4) == base    # moved, comments, docstring, __future__
    changed = script(tmp_path, CHANGED, seed=5)
    assert console(tmp_path, CHANGED, seed=6) == changed
    differ = {k for k in base if base[k] != changed[k]}
    assert differ == {"taste", "reduced"}             # the two jobs on ``ratio``
    constant = script(tmp_path, CONSTANT, seed=7)
    assert {k for k in base if base[k] != constant[k]} == {"rich"}    # SCALE, read by helper


@pytest.mark.timeout(600, method="thread")
def test_python_O_strips_asserts_and_docstrings_only_a_pipeline_with_an_assert_changes(tmp_path):
    base = script(tmp_path)
    for flag, seed in (("-O", 8), ("-OO", 9)):
        optimized = script(tmp_path, SOURCE, flag, seed=seed)
        assert {k for k in base if base[k] != optimized[k]} == {"checked"}, flag


# -- in one process: what is and is not part of a code object's identity ----------------------
def _compiled(body: str, *, filename: str = "<x>", blank_lines: int = 0, mode: str = "exec", flags: int = 0,
              ns: dict | None = None) -> Any:
    namespace: dict = {"np": np, **(ns or {})}
    exec(compile("\n" * blank_lines + body, filename, mode, flags=flags, dont_inherit=True), namespace)  # noqa: S102
    return namespace["f"]


ATOMS = st.sampled_from(["a", "b", "2", "0.5", "-1", "np.tanh(a)", "abs(b)", "(a if a > b else b)"])
OPS = st.sampled_from(["+", "-", "*", "/", "**", "%", "<", "=="])


@st.composite
def expressions(draw, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(ATOMS)
    return f"({draw(expressions(depth - 1))} {draw(OPS)} {draw(expressions(depth - 1))})"


@settings(max_examples=150, deadline=None)
@given(expressions(), st.integers(0, 300), st.sampled_from(["exec", "single"]), st.booleans())
def test_where_and_how_a_function_is_compiled_is_not_its_identity(expr, blank_lines, mode, future):
    body = f"def f(a, b):\n    return {expr}\n"
    plain = _compiled(body)
    if mode == "single":
        body += "\n"           # an interactive statement ends with a blank line
    import __future__
    other = _compiled(f"def f(a, b):\n    'a docstring'\n    # a comment\n    return {expr}  # why\n"
                      if mode == "exec" else body, filename="<stdin>", blank_lines=blank_lines, mode=mode,
                      flags=__future__.annotations.compiler_flag if future else 0)
    assert code_identity(plain.__code__) == code_identity(other.__code__)
    assert pipeline_fingerprint(plain) == pipeline_fingerprint(other)


@settings(max_examples=150, deadline=None)
@given(expressions(), expressions())
def test_two_functions_with_one_identity_compute_the_same(e1, e2):
    f, g = _compiled(f"def f(a, b):\n    return {e1}\n"), _compiled(f"def f(a, b):\n    return {e2}\n")
    if pipeline_fingerprint(f) != pipeline_fingerprint(g):
        return
    a, b = np.array([0.3, -1.5, 2.0, 4.0]), np.array([1.25, 0.5, -3.0, 4.0])
    with np.errstate(all="ignore"):
        try:
            want = f(a, b)
        except Exception as e:
            with pytest.raises(type(e)):
                g(a, b)
            return
        np.testing.assert_array_equal(want, g(a, b))


def test_a_method_call_on_an_import_of_another_compilation_unit_is_the_same_call():
    """``np.tanh(x)`` compiles to ``LOAD_GLOBAL np + NULL; LOAD_ATTR`` beside ``import numpy as
    np`` and to ``LOAD_METHOD`` in a unit without it (a console line, another notebook cell)."""
    beside = _compiled("import numpy as np\ndef f(a):\n    return np.tanh(a) + len(a)\n")
    alone = _compiled("def f(a):\n    return np.tanh(a) + len(a)\n")
    ops = [i.opname for i in __import__("dis").get_instructions(alone)]
    assert "LOAD_METHOD" in ops or sys.version_info >= (3, 12)
    assert pipeline_fingerprint(beside) == pipeline_fingerprint(alone)
    assert pipeline_fingerprint(alone) != pipeline_fingerprint(_compiled("def f(a):\n    return np.sinh(a) + len(a)\n"))


SECRET = 3.0


def test_what_a_pipeline_reads_anywhere_in_its_code_is_in_its_address():
    """Scheme 1 saw only the names of the function's own code: a constant read in a
    comprehension or a lambda, and keyword-only defaults, were not in its address."""
    def in_comprehension(a):
        return sum(SECRET * x for x in a)

    def kw_only(a, *, k=3):
        return a * k

    global SECRET
    before = pipeline_fingerprint(in_comprehension)
    SECRET = 4.0
    try:
        assert pipeline_fingerprint(in_comprehension) != before
    finally:
        SECRET = 3.0
    assert pipeline_fingerprint(in_comprehension) == before
    assert pipeline_fingerprint(kw_only)["kwdefaults"] == {"k": 3}
    kw_only.__kwdefaults__ = {"k": 4}
    assert pipeline_fingerprint(kw_only)["kwdefaults"] == {"k": 4}


class Gain:
    def __init__(self, g):
        self.g = g

    def __call__(self, a):
        return self.g * a


def test_a_user_class_is_described_by_its_code_and_not_by_its_module_name():
    job = mc.Job(Gain(2.0), {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1)
    text = str(job.describe())
    assert __name__ not in text and "Gain.__call__" in text
    renamed = type("Gain", (), {"__init__": Gain.__init__, "__call__": Gain.__call__, "__module__": "__main__",
                                "__qualname__": "Gain"})
    assert mc.Job(renamed(2.0), {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1).id == job.id
    assert job.describe(scheme=1) != job.describe()        # scheme 1 kept the module's name
    assert job.address(1) != job.id


def test_the_description_records_its_scheme_and_the_bytecode_it_depends_on():
    job = mc.Job(lambda a: a + 1, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1)
    d = job.describe()
    assert d["address"] == {"scheme": SCHEME, "bytecode": BYTECODE} and SCHEME == 2
    assert BYTECODE == (sys.implementation.cache_tag or BYTECODE) and BYTECODE.endswith(
        f"{sys.version_info[0]}{sys.version_info[1]}")
    assert scheme_of(d, "m") == 2 and scheme_of(job.describe(scheme=1), "m") == 1
    assert "address" not in job.describe(scheme=1) and job.address() == job.id
    with pytest.raises(StoreError, match="content-address scheme 3; this version of dask_research knows 1, 2"):
        scheme_of({**d, "address": {"scheme": 3, "bytecode": BYTECODE}}, "m")
    with pytest.raises(InputError, match="scheme=7 is invalid; expected one of 1, 2"):
        job.describe(scheme=7)


def test_the_stored_description_s_address_is_checked_and_another_python_is_named():
    """A manifest's ``address`` must be a scheme and a bytecode tag; a run addressed under
    another Python minor version is named as such when its job does not match."""
    from dask_research.durable.schema import Invalid, check
    from dask_research.montecarlo.audit import _python_changed
    from dask_research.montecarlo.store.documents import _JOB

    job = mc.Job(lambda a: a * 3, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=5)
    check(job.describe(), _JOB)
    check(job.describe(scheme=1), _JOB)
    with pytest.raises(Invalid, match="address.scheme is 1"):
        check({**job.describe(), "address": {"scheme": 1, "bytecode": BYTECODE}}, _JOB)
    other = {**job.describe(), "address": {"scheme": 2, "bytecode": "cpython-399"}}
    assert f"addressed by cpython-399's bytecode, this is {BYTECODE}" in _python_changed(other)
    assert _python_changed(job.describe()) == "" and _python_changed(job.describe(scheme=1)) == ""


class Half:
    def __init__(self, scale):
        self.scale = scale

    def init(self):
        return 0.0

    def update(self, state, y):
        return state + float(np.sum(y)) * self.scale

    def merge(self, p, q):
        return p + q

    def finalize(self, state):
        return state


def test_reducers_bound_methods_and_partials_keep_distinct_addresses():
    def job(pipeline, **kw):
        return mc.Job(pipeline, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=8, seed=1, **kw)

    def add(a, k):
        return a + k

    def tanh(a):
        return np.tanh(a)

    jobs = [job(tanh), job(functools.partial(add, k=1.0)), job(functools.partial(add, k=2.0)),
            job(Gain(2.0).__call__), job(Gain(3.0).__call__), job(tanh, reducer=Half(0.5)),
            job(tanh, reducer=Half(0.25))]
    assert len({j.id for j in jobs}) == len(jobs)
    assert job(functools.partial(add, k=1.0)).id == jobs[1].id and job(tanh, reducer=Half(0.5)).id == jobs[5].id
