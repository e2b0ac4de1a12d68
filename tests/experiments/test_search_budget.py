"""A search whose budget is given spends it unless the space is exhausted, and says which
(issue 30).

The defect: with ``objective="max"`` the ``no-better-best`` gate pruned the branches that could
not (by its bound) beat the best, the branch holding the best then ran out of configurations,
and the run stopped with ``queue_empty`` and budget left while the pruned branches had
untried configurations (``ask()`` raised ``nothing to ask``). Now the pruned branches come
back (``revive`` events) until the budget is spent or every source is exhausted.
"""
from __future__ import annotations

import optuna
import pytest

from dask_research.exceptions import ExperimentError
from dask_research.experiments import Branch, IterationScheduler, OptunaSource

D = optuna.distributions


def finite(values: list[float]):
    """A source proposing ``values`` in order, then exhausted."""
    it = iter(values)
    return lambda branch: next(it, None)


def small_and_big(big: int = 50) -> list[Branch]:
    """The holder of the best has 3 configurations; the other ``big`` weak ones."""
    return [Branch("small", propose=finite([0.99, 0.98, 0.97])),
            Branch("big", propose=finite([0.5 + k * 1e-3 for k in range(big)]))]


def _sched(budget: int, **kw) -> IterationScheduler:
    return IterationScheduler(lambda h: h.payload, slots=1, objective="max",
                              max_experiments=budget, progress=False,
                              apply_order="dispatch", **kw)


def test_ask_tell_loop_of_the_docs_spends_the_budget_after_a_prune():
    sched = _sched(20)
    sched.add(small_and_big())
    for _ in range(20):                     # the docs' loop: raised 'nothing to ask' after 11
        h = sched.ask()
        sched.tell(h, h.payload)
    report = sched.report()
    assert report.total_runs == 20
    kinds = [ev.kind for ev in report.events]
    assert "prune" in kinds and "revive" in kinds
    assert report.branches["big"].pruned is None and report.branches["big"].runs == 17
    with pytest.raises(ExperimentError, match="max_experiments budget is spent"):
        sched.ask()


def test_documented_search_configuration_spends_its_budget():
    """OptunaSource(unique=True) per family, the holder's grid exhausted first."""
    space = {"small": {"x": D.IntDistribution(0, 2)}, "big": {"x": D.IntDistribution(0, 39)}}
    score = {"small": lambda x: 0.97 + 0.01 * x, "big": lambda x: 0.5 + 1e-3 * x}
    sched = IterationScheduler(lambda h: score[h.branch](h.payload["x"]), slots=2,
                               objective="max", max_experiments=25, progress=False,
                               apply_order="dispatch")
    sched.add([Branch(name, propose=OptunaSource(sp, seed=k, unique=True))
               for k, (name, sp) in enumerate(space.items())])
    report = sched.run()
    assert report.stop_reason == "max_experiments"
    assert report.stopped_because == "budget spent"
    assert report.total_runs == 25
    configs = [(r.hypothesis.branch, r.hypothesis.payload["x"]) for r in report.results]
    assert len(set(configs)) == 25                    # unique: nothing run twice


def test_exhausted_space_says_so():
    sched = _sched(60)
    sched.add(small_and_big(big=5))
    report = sched.run()
    assert report.total_runs == 8                     # every configuration, then nothing left
    assert report.stop_reason == "queue_empty"
    assert report.stopped_because == "space exhausted"


def test_without_a_budget_the_gate_still_prunes():
    """No budget: the gate's prune stands (it is what ends an open-ended search)."""
    sched = IterationScheduler(lambda h: h.payload, slots=1, objective="max", progress=False,
                               apply_order="dispatch")
    sched.add(small_and_big())
    report = sched.run()
    assert report.branches["big"].pruned == "no-better-best"
    assert report.total_runs < 53
    assert report.stopped_because == "space exhausted except pruned branches: big"


def test_a_revived_branch_stays_revived_on_resume(tmp_path):
    path = tmp_path / "search.jsonl"
    sched = _sched(30, checkpoint=path)
    sched.add(small_and_big())
    for _ in range(15):
        h = sched.ask()
        sched.tell(h, h.payload)
    assert "revive" in [ev.kind for ev in sched.report().events]
    sched.close()                           # the journal's lock is released
    again = IterationScheduler.resume(path, lambda h: h.payload)
    again.add([Branch("small", propose=finite([])),
               Branch("big", propose=finite([0.6 + k * 1e-3 for k in range(50)]))])
    report = again.run()
    assert report.branches["big"].pruned is None
    assert report.total_runs == 30 and report.stopped_because == "budget spent"
