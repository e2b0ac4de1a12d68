"""The progress bar counts the budget, ends at 100 %, and updates in a notebook without
ipywidgets (issue 15)."""
import re
import sys
import types
import warnings

import pytest

from dask_research import progress as progress_mod
from dask_research.experiments import Hypothesis, IterationScheduler


def _final(err):
    """The last redraw of the bar (tqdm redraws with carriage returns)."""
    return re.split(r"[\r\n]", err.strip())[-1]


def _run(n, budget):
    sched = IterationScheduler(lambda h: 0.5, slots=3, progress=True, prune_floor=0.0,
                               max_experiments=budget)
    sched.add([Hypothesis(f"h{k}", f"b{k % 7}") for k in range(n)])
    return sched.run()


def test_the_bar_counts_the_budget_and_ends_at_100_percent(capsys):
    report = _run(400, 180)
    assert report.stop_reason == "max_experiments"
    last = _final(capsys.readouterr().err)
    assert "experiments: 100%" in last and "180/180" in last and "max_experiments" in last


def test_the_bar_ends_at_100_percent_when_the_queue_empties_first(capsys):
    report = _run(85, 180)
    assert report.stop_reason == "queue_empty"
    last = _final(capsys.readouterr().err)
    assert "100%" in last and "85/85" in last and "queue_empty" in last


def test_the_bar_starts_from_what_a_resumed_run_spent(tmp_path, capsys):
    path = tmp_path / "loop.jsonl"
    sched = IterationScheduler(lambda h: 0.5, slots=1, progress=False, checkpoint=path,
                               prune_floor=0.0, max_experiments=20)
    sched.add([Hypothesis(f"h{k}", "a") for k in range(50)])
    sched.run()
    capsys.readouterr()
    IterationScheduler.resume(path, lambda h: 0.5, progress=True, max_experiments=30).run()
    last = _final(capsys.readouterr().err)
    assert "30/30" in last and "100%" in last


@pytest.fixture
def fake_kernel(monkeypatch):
    """Make this process look like a Jupyter kernel (what tqdm.auto looks for)."""
    shell = types.SimpleNamespace(config={"IPKernelApp": {}})
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    return monkeypatch


def test_in_a_notebook_without_ipywidgets_the_text_bar_is_used(fake_kernel, capsys):
    real = progress_mod.importlib.util.find_spec
    fake_kernel.setattr(progress_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    from tqdm.std import tqdm as text_tqdm

    assert progress_mod.bar_class() is text_tqdm
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no "IProgress not found"
        _run(40, None)
    assert "40/40" in _final(capsys.readouterr().err)


def test_in_a_notebook_with_ipywidgets_the_widget_is_used(fake_kernel):
    fake_kernel.setattr(progress_mod.importlib.util, "find_spec", lambda name, *a: object())
    from tqdm.notebook import tqdm as notebook_tqdm

    assert progress_mod.bar_class() is notebook_tqdm


@pytest.mark.slow
def test_a_real_kernel_without_ipywidgets_shows_a_text_bar_that_finishes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if progress_mod.importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed here: the widget path is used")
    code = (
        "from dask_research.experiments import Hypothesis, IterationScheduler\n"
        "sched = IterationScheduler(lambda h: 0.5, slots=3, progress=True, prune_floor=0.0,\n"
        "                           max_experiments=60)\n"
        "sched.add([Hypothesis(f'h{k}', f'b{k % 5}') for k in range(200)])\n"
        "report = sched.run()\n"
        "print(report.stop_reason)\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs
    err = "".join(o.text for o in outputs if o.get("name") == "stderr")
    out = "".join(o.text for o in outputs if o.get("name") == "stdout")
    assert "IProgress not found" not in err and "max_experiments" in out
    assert "60/60" in _final(err) and "100%" in _final(err)
