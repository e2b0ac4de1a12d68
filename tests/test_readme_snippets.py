"""The README's and getting-started's Python code blocks run as written, as a script and pasted
into a console (``code.InteractiveConsole``), each in a fresh temporary directory, in a real
``python`` subprocess.

The blocks are parsed out of the documents (never copied here). A block that promises a value
in a comment (``... # ...: True``) must show it; every other block must run without an error.
A block that connects to ``DASK_SCHEDULER_ADDRESS`` also runs, as a script, against a real
``dask scheduler`` with two ``dask worker`` processes started in another directory. Blocks that
need SLURM are skipped with the reason (the SLURM page's blocks run in ``tests/deploy``).
"""
import ast
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from dask_research.testing.processes import subprocess_env

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
    if "DASK_SCHEDULER_ADDRESS" in code:        # runs anywhere: in-process, or on the address given
        return None
    for marker, reason in NEEDS.items():
        if marker in code:
            return reason
    return None


def _promised(code):
    """What the block's comments say the last line shows (``# ...: True``), or None."""
    m = re.search(r"#[^\n]*:\s*(True|False)\s*$", code.rstrip())
    return m.group(1) if m else None


def _env():
    env = subprocess_env()
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
def _cases():
    """(how, block) for every block, run as a script and in a console; the fast lane
    (``-m "not slow"``) keeps the README's first block as a script."""
    for how in ("script", "console"):
        for block in BLOCKS:
            fast = how == "script" and block.id == "README-0"
            yield pytest.param(how, block.values[0], id=f"{how}-{block.id}",
                               marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize("how, code", list(_cases()))
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


SCHEDULER_BLOCKS = [b for b in BLOCKS if "DASK_SCHEDULER_ADDRESS" in b.values[0]]


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("readme_snippets")


@pytest.fixture(scope="module")
def real_scheduler(tmp_path_factory):
    """``dask scheduler`` and two ``dask worker`` processes, in a directory of their own."""
    import socket
    import time

    where = tmp_path_factory.mktemp("cluster")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    env = _env()
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--dashboard-address", ":0"], cwd=where, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                           "--nthreads", "1", "--no-nanny", "--dashboard-address", ":0"],
                                          cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        deadline = time.monotonic() + 60
        with Client(address, timeout=60) as c:
            while len(c.scheduler_info()["workers"]) < 2:
                assert time.monotonic() < deadline, "the workers did not connect"
                time.sleep(0.2)
        yield address
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait(10)


@pytest.mark.timeout(300, method="thread")
@pytest.mark.slow
@pytest.mark.parametrize("code", SCHEDULER_BLOCKS)
def test_code_block_runs_on_a_real_scheduler(tmp_path, code, real_scheduler):
    """The block as a script in a fresh directory, with ``DASK_SCHEDULER_ADDRESS`` set as the docs say."""
    (tmp_path / "snippet.py").write_text(_as_script(code))
    env = dict(_env(), DASK_SCHEDULER_ADDRESS=real_scheduler)
    res = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=280)
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"2 workers at {real_scheduler}" in res.stdout, res.stdout[-2000:]
    # With two workers every check re-ran on the other one, as the text after the block says.
    assert re.search(r"verified +(\d+) shards re-run, all match: \1 on another worker", res.stdout), res.stdout[-2000:]


def test_a_scheduler_block_is_found():
    assert SCHEDULER_BLOCKS, "getting-started no longer has a block that connects to DASK_SCHEDULER_ADDRESS"
