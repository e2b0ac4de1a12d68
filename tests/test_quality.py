"""The quality gates the package promises: ruff finds nothing, mypy finds nothing (py.typed is
shipped), the docstring examples are collected, and one rule decides which doctests are left out.

The ruff and mypy configuration is in pyproject.toml; both tools come with the ``test`` extra.
"""
import os
import pathlib
import subprocess
import sys

import pytest

from dask_research.testing.optional import OPTIONAL, example_imports, missing_dependency, top_level_imports

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINTED = ("dask_research", "tests", "benchmarks", "examples")


def _tool(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` at the repository root; skip where it is not installed,
    except in CI, where a gate that cannot run is a failure."""
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed: pip install -e '.[test]'")
        pytest.skip(f"needs {module} (the test extra)")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(300, method="thread")
def test_ruff_finds_nothing():
    out = _tool("ruff", "check", "--no-fix", "--output-format", "concise", *LINTED, timeout=240)
    assert out.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{out.stdout[-8000:]}{out.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.timeout(900, method="thread")
def test_mypy_finds_nothing():
    # files = ["dask_research"] (pyproject). The incremental cache lives in the checkout: kept
    # between runs there (a re-run checks only what changed), absent from a fresh clone. A full
    # run checks independent modules in two processes (mypy's -n, same findings; experimental,
    # so a crash of that mode, exit 2, is followed by a run in one process).
    args = ("--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache"))
    out = _tool("mypy", *args, *(("-n", "2") if (os.cpu_count() or 1) >= 2 else ()), timeout=840)
    if out.returncode == 2:
        out = _tool("mypy", *args, timeout=840)
    assert out.returncode == 0, f"mypy dask_research:\n{out.stdout[-8000:]}{out.stderr[-2000:]}"


def test_the_package_is_typed_and_ships_its_marker():
    assert (ROOT / "dask_research" / "py.typed").exists()
    assert "py.typed" in (ROOT / "setup.cfg").read_text()


def test_pytest_collects_the_package_doctests():
    cfg = (ROOT / "setup.cfg").read_text()
    section = cfg[cfg.index("[tool:pytest]"):]
    assert "--doctest-modules" in section
    testpaths = next(line for line in section.splitlines() if line.startswith("testpaths"))
    assert testpaths.split("=", 1)[1].split() == ["tests", "dask_research"]


def test_only_modules_needing_a_missing_optional_dependency_are_left_out(tmp_path):
    leaves = {p: missing_dependency(p) for p in (ROOT / "dask_research").rglob("*.py")}
    left_out = {p for p, dep in leaves.items() if dep}
    # the core of the package (config, cli, exceptions...) always runs its examples
    assert not left_out & {ROOT / "dask_research" / n for n in ("__init__.py", "config.py", "cli.py")}
    for p in left_out:
        assert (top_level_imports(p) | example_imports(p)) & OPTIONAL
    guarded = tmp_path / "guarded.py"
    guarded.write_text("try:\n    import ray\nexcept ImportError:\n    ray = None\n")
    assert missing_dependency(guarded, optional={"ray"}) is None
    lazy = tmp_path / "lazy.py"        # imports at call time; only its example needs the package
    lazy.write_text('def f():\n    """\n    >>> import no_such_framework\n    >>> f()\n    """\n'
                    "    import no_such_framework\n")
    assert top_level_imports(lazy) == set() and example_imports(lazy) == {"no_such_framework"}
    assert missing_dependency(lazy, optional={"no_such_framework"}) == "no_such_framework"


def test_every_optional_dependency_is_an_extra():
    """The package's optional imports are the ones setup.cfg's extras bring."""
    cfg = (ROOT / "setup.cfg").read_text()
    extras = cfg[cfg.index("[options.extras_require]"):cfg.index("[options.entry_points]")].lower()
    distribution = {"cupy": "cupy-cuda12x", "dask_jobqueue": "dask-jobqueue",
                    "stable_baselines3": "stable-baselines3"}
    for name in OPTIONAL:
        assert distribution.get(name, name) in extras, name


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_data_directories_of_the_tests_are_never_collected():
    """Their files are what tests read and the scripts that wrote them: --doctest-modules
    imported tests/montecarlo/data/make_store_v1.py, which runs a cluster at import, and the
    collection of the whole suite deadlocked there."""
    data = sorted(p for p in (ROOT / "tests").rglob("data") if p.is_dir())
    assert data
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *map(str, data)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 5, out.stdout[-3000:] + out.stderr[-2000:]      # 5: nothing collected
    assert "::" not in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_a_collection_that_hangs_ends_the_run_with_every_threads_stack(tmp_path):
    (tmp_path / "test_blocks_at_import.py").write_text("import time\ntime.sleep(600)\n")
    env = {**os.environ, "DASK_RESEARCH_COLLECTION_LIMIT": "5"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                          str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode != 0
    err = out.stdout + out.stderr
    assert "the collection took more than 5 s" in err and "test_blocks_at_import.py" in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")
def test_the_collection_limit_never_ends_a_parallel_run_that_is_longer(tmp_path):
    """xdist's controller collects nothing: the limit, armed there too, ended every parallel run
    longer than it (a 915 s suite on a busy machine, at 900 s) with the controller's stack."""
    (tmp_path / "test_longer_than_the_limit.py").write_text("import time\n\n"
                                                            "def test_slow():\n    time.sleep(8)\n")
    env = {**os.environ, "DASK_RESEARCH_COLLECTION_LIMIT": "3"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                          "-n", "2", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0 and "1 passed" in out.stdout, (out.stdout + out.stderr)[-3000:]


def _rooms_imported(path: pathlib.Path, package: pathlib.Path) -> set[str]:
    """The top-level parts of ``dask_research`` (a module, or a subpackage) that the file at
    ``path`` imports anywhere in it, functions included (a lazy import is still an arrow)."""
    import ast

    here = list(path.relative_to(package.parent).with_suffix("").parts[:-1])   # the file's package
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[list[str]] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = here[:len(here) - node.level + 1] if node.level else []
            base = anchor + (node.module.split(".") if node.module else [])
            names = [base] if node.module else [base + [a.name] for a in node.names]
        for parts in names:
            if len(parts) >= 2 and parts[0] == "dask_research":
                out.add(parts[1])
    return out


def test_the_parts_of_the_package_import_each_other_without_a_circle():
    """docs/architecture.rst: "The import graph has no circles; every arrow points down". A part
    is a top-level module or a subpackage; lazy imports inside functions count (a capability's
    command once imported a check from the command group that imports the capability)."""
    package = pathlib.Path(__file__).resolve().parents[1] / "dask_research"
    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).parts
        room = rel[0][:-3] if len(rel) == 1 else rel[0]
        edges.setdefault(room, set()).update(r for r in _rooms_imported(path, package) if r != room)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(room: str) -> None:
        state[room] = 1
        stack.append(room)
        for nxt in sorted(edges.get(room, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[room] = 2

    for room in sorted(edges):
        if room not in state:
            visit(room)
    assert {"cli", "montecarlo", "durable"} <= set(edges) and "durable" in edges["montecarlo"]
