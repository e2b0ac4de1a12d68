"""The integration pages' and modules' examples run (doctest)."""
import doctest
import importlib
import pathlib

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.timeout(300, method="thread")
def test_integrations_page_examples():
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("torchrl.data")
    result = doctest.testfile(str(DOCS / "integrations.rst"), module_relative=False,
                              optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 10


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("module,needs", [("", "stable_baselines3"), (".sb3", "stable_baselines3"),
                                          (".torchrl", "torchrl.data")])
def test_module_examples(module, needs):
    if needs:
        pytest.importorskip(needs)
    mod = importlib.import_module("dask_research.replay.integrations" + module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_adapter_examples():
    mod = importlib.import_module("dask_research.replay.adapter")
    assert doctest.testmod(mod).failed == 0


def test_importing_replay_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys, dask_research.replay, dask_research.replay.integrations as i; "
            "print(sorted(m for m in ('torch', 'stable_baselines3', 'torchrl', 'tensordict', 'ray') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
