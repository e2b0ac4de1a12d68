"""Every Python block of the capability pages either runs as written or is visibly a fragment
that names what it assumes (issue 29).

The blocks are parsed out of the pages (never copied here), with the README test's parser
(``tests/test_readme_snippets.py``). A block whose first line is ``# Fragment: assumes ...``
is a fragment: the fast test checks that every name it uses without defining or importing it
is named on that line. Every other block runs as a script in a fresh temporary directory, in
a real ``python`` subprocess (slow: a block is a whole program).
"""
import ast
import builtins
import pathlib
import re

import pytest
from test_readme_snippets import _as_script, _rst_blocks

from dask_research.testing.processes import run_python

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ("experiments", "search-loops", "replay", "replay-cluster", "integrations", "montecarlo", "configuration",
         "deployment", "events", "gpu", "power")
MARK = re.compile(r"^# Fragment: assumes (.+)$")
NEEDS = {"ray.rllib": "ray"}          # a block that imports it is skipped without it
#: What a block's run must also show, after it ran as written (appended to its script). The
#: RLlib block is the suite's one RLlib DQN run: it trains with the plane as its buffer.
THEN = {"PlaneEpisodeReplayBuffer": (
    "\nrb = algo.local_replay_buffer\n"
    "assert type(rb).__name__ == 'PlaneEpisodeReplayBuffer' and len(rb) >= 1_000, (type(rb), len(rb))\n"
    "algo.stop()\n")}


def _blocks():
    out = []
    for page in PAGES:
        for i, code in enumerate(_rst_blocks(ROOT / "docs" / f"{page}.rst")):
            out.append(pytest.param(code, id=f"{page}-{i}"))
    return out


BLOCKS = _blocks()


def _is_fragment(code):
    return MARK.match(code.splitlines()[0]) is not None


def free_names(code):
    """Names a block reads without binding them (assignment, import, def, argument, loop)."""
    tree = ast.parse(code)
    bound, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return used - bound


def test_free_names():
    assert free_names("import numpy as np\nx = np.ones(train(y))\ndef f(a): return a + z") == \
        {"train", "y", "z"}


def test_the_pages_have_blocks_of_both_kinds():
    assert len(BLOCKS) >= 12
    kinds = {_is_fragment(p.values[0]) for p in BLOCKS}
    assert kinds == {True, False}


@pytest.mark.parametrize("code", [p for p in BLOCKS if _is_fragment(p.values[0])])
def test_a_fragment_names_what_it_assumes(code):
    named = set(re.findall(r"\w+", MARK.match(code.splitlines()[0]).group(1)))
    missing = free_names(code) - named
    assert not missing, f"the block uses {sorted(missing)} without defining them; name them " \
                        "on its '# Fragment: assumes ...' line, or define them"


@pytest.mark.slow
@pytest.mark.timeout(600, method="thread")
@pytest.mark.parametrize("code", [p for p in BLOCKS if not _is_fragment(p.values[0])])
def test_a_block_runs_as_written(code, tmp_path):
    for marker, module in NEEDS.items():
        if marker in code:
            pytest.importorskip(module)
    assert not free_names(code), f"uses {sorted(free_names(code))}: define them or mark a fragment"
    then = "".join(check for marker, check in THEN.items() if marker in code)
    r = run_python(_as_script(code) + then, tmp_path, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]


# how long something takes, said with no machine: "a few seconds" on a busy 2-core machine was 41 s
VAGUE_TIME = re.compile(r"a few seconds|under a minute|about (a|ten) seconds?|about a second", re.I)


def test_no_run_time_is_promised_without_its_machine():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst")),
             *sorted((ROOT / "examples").glob("*.py")), ROOT / "dask_research" / "demo.py"]
    claims = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in files
              for i, line in enumerate(f.read_text().splitlines(), 1)
              if VAGUE_TIME.search(line) and not re.search(r"\bcores?\b|machine", line)]
    assert not claims, "quote a time with the machine it was measured on, or not at all:\n" + \
        "\n".join(claims)
