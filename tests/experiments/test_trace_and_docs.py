"""The trace's derived figures on hand-made events, and the docstring examples."""
import doctest
import importlib
import math

import pytest

from dask_research.experiments import Trace


def _trace():
    tr = Trace(slots=2)
    tr.emit("add", 0.0, queued=3)
    tr.emit("dispatch", 0.0, branch="a", hypothesis="h1", slot=0, queued=2)
    tr.emit("dispatch", 0.0, branch="b", hypothesis="h2", slot=1, queued=1)
    tr.emit("result", 1.0, branch="a", hypothesis="h1", slot=0, queued=1)
    tr.emit("dispatch", 1.5, branch="a", hypothesis="h3", slot=0, queued=0)   # 0.5 s late
    tr.emit("failure", 2.0, branch="b", hypothesis="h2", slot=1, queued=0)
    tr.emit("result", 3.0, branch="a", hypothesis="h3", slot=0, queued=0)
    return tr


def test_intervals_concurrency_and_occupancy():
    tr = _trace()
    assert [(iv.slot, iv.start, iv.end, iv.hypothesis) for iv in tr.intervals()] == [
        (0, 0.0, 1.0, "h1"), (1, 0.0, 2.0, "h2"), (0, 1.5, 3.0, "h3")]
    assert tr.max_concurrency() == 2
    assert tr.concurrency() == [(0.0, 1), (0.0, 2), (1.0, 1), (1.5, 2), (2.0, 1), (3.0, 0)]
    # work was queued during [0, 1.5): 2 slots busy for 1 s, then 1 of 2 for 0.5 s
    assert tr.occupancy() == pytest.approx((2 * 1.0 + 1 * 0.5) / (2 * 1.5))
    # window = first..last dispatch = [0, 1.5]: busy 1.0 + 1.5 of 3 slot-seconds
    assert tr.occupancy(0.0, 1.5) == pytest.approx(2.5 / 3.0)
    assert math.isnan(Trace().occupancy())


def test_records_and_scores():
    import numpy as np

    tr = Trace(slots=1, branches=["a", "b"])
    ev = tr.emit("select", 0.1, branch="b", scores=np.array([0.5, np.inf]), score=np.inf)
    assert tr.scores(ev) == {"a": 0.5, "b": math.inf}
    assert tr.to_records() == [{"seq": 0, "t": 0.1, "kind": "select", "branch": "b",
                                "score": "inf", "scores": {"a": 0.5, "b": "inf"}}]
    assert tr.picks() == ["b"] and len(tr.of("select")) == 1
    with pytest.raises(ValueError, match="carries no scores"):
        tr.scores(tr.emit("stop", 1.0))
    assert "select=1" in repr(tr)


def _experiment_modules() -> list[str]:
    import pkgutil

    import dask_research.experiments as ex

    found = [m.name for m in pkgutil.walk_packages(ex.__path__, "dask_research.experiments.")]
    return ["dask_research.experiments", *sorted(found)]


@pytest.mark.parametrize("name", _experiment_modules())
def test_docstring_examples(name):
    """Every experiments module (found, not listed, so a rename cannot drop one) shows a use
    in a docstring example, and every example runs."""
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_exports_are_what_the_api_docs_document():
    import pathlib
    import re

    import dask_research.experiments as ex

    api = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.rst").read_text()
    section = api.split("\nExperiments\n-----------\n", 1)[1].split("\n------", 1)[0]
    documented = re.findall(r"^   (\S+)$", section, flags=re.M)
    aliases = {"Result", "Interval"}                # former names, in the section's prose
    assert all(f"``{name}``" in section for name in aliases)
    assert sorted(set(documented) - {"policies"} | aliases) == sorted(ex.__all__)
    for name in ex.__all__:
        assert getattr(ex, name) is not None


def test_renamed_types_keep_their_old_names():
    import dask_research.experiments as ex
    from dask_research.experiments.decision_trace import Interval, SlotInterval
    from dask_research.experiments.types import ExperimentResult, Result

    assert Result is ExperimentResult is ex.Result is ex.ExperimentResult
    assert Interval is SlotInterval is ex.Interval is ex.SlotInterval
    assert ExperimentResult.__name__ == "ExperimentResult"


def test_formerly_exported_internals_still_import_with_a_warning():
    import dask_research.experiments as ex
    from dask_research.experiments.ledger import BranchLedger
    from dask_research.experiments.policies import ucb1_scores

    with pytest.warns(DeprecationWarning, match=r"import it from dask_research\.experiments\.ledger"):
        assert ex.BranchLedger is BranchLedger
    with pytest.warns(DeprecationWarning, match=r"experiments\.policies"):
        assert ex.ucb1_scores is ucb1_scores
    with pytest.raises(AttributeError):
        ex.no_such_name  # noqa: B018
