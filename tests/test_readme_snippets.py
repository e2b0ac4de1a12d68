"""The README's and getting-started's Python code blocks run as written, as a script and pasted
into a console (``code.InteractiveConsole``), each in a fresh temporary directory, in a real
``python`` subprocess.

The blocks are parsed out of the documents (never copied here). A block that promises a value
in a comment (``... # ...: True``) must show it; every other block must run without an error.
Blocks that need a running scheduler or SLURM are skipped with the reason.
"""
import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEEDS = {"tcp://": "needs a running dask scheduler at the address it names",
         "SLURM": "needs a SLURM cluster", "jobqueue": "needs dask-jobqueue on a batch system"}


def _markdown_blocks(path):
    text = path.read_text()
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


def _rst_blocks(path):
    """Bodies of ``.. code-block:: python`` directives (indented text after the directive)."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^\s*\.\. code-block::\s*python\s*$", lines[i]):
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith(":")):
                i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                body.append(lines[i])
                i += 1
            out.append(textwrap.dedent("\n".join(body)).strip() + "\n")
        else:
            i += 1
    return out


BLOCKS = [pytest.param(code, id=f"README-{i}") for i, code in enumerate(_markdown_blocks(ROOT / "README.md"))]
BLOCKS += [pytest.param(code, id=f"getting-started-{i}")
           for i, code in enumerate(_rst_blocks(ROOT / "docs" / "getting-started.rst"))]


def _skip_reason(code):
    for marker, reason in NEEDS.items():
        if marker in code:
            return reason
    return None


def _promised(code):
    """What the block's comments say the last line shows (``# ...: True``), or None."""
    m = re.search(r"#[^\n]*:\s*(True|False)\s*$", code.rstrip())
    return m.group(1) if m else None


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.setdefault("TQDM_DISABLE", "1")
    return env


def _as_script(code):
    """The block as written; a trailing bare expression is printed, as a console would show it."""
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr) and not (isinstance(last.value, ast.Call)
                                           and getattr(last.value.func, "id", None) == "print"):
        lines = code.rstrip().splitlines()
        head = "\n".join(lines[: last.lineno - 1])
        expr = ast.get_source_segment(code, last.value)
        return f"{head}\nprint({expr})\n"
    return code


CONSOLE = r'''
import code, sys
src = open(sys.argv[1]).read()
console = code.InteractiveConsole()
more = False
for line in src.splitlines():
    more = console.push(line)
if more:
    console.push("")
'''


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("code", BLOCKS)
@pytest.mark.parametrize("how", ["script", "console"])
def test_code_block_runs_as_written(tmp_path, code, how):
    reason = _skip_reason(code)
    if reason:
        pytest.skip(reason)
    if how == "script":
        (tmp_path / "snippet.py").write_text(_as_script(code))
        cmd = [sys.executable, "snippet.py"]
    else:
        (tmp_path / "snippet.txt").write_text(code)
        (tmp_path / "console_driver.py").write_text(CONSOLE)
        cmd = [sys.executable, "console_driver.py", "snippet.txt"]
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-4000:]
    # The console prints a failing line's traceback and carries on: look for it, not just the exit status.
    assert "Traceback" not in res.stderr and not re.search(r"^\w*(Error|Exception)\b", res.stderr, re.M), \
        res.stderr[-4000:]
    want = _promised(code)
    if want is not None:
        assert res.stdout.strip().splitlines()[-1] == want, res.stdout[-2000:]


def test_the_blocks_are_found():
    """The parser finds the README's 'A taste' block (if it finds nothing, nothing is tested)."""
    readme = _markdown_blocks(ROOT / "README.md")
    assert any("mc.replay(" in b and _promised(b) == "True" for b in readme)
