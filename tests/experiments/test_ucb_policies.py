"""UCB1 and the gates as pure functions: unit checks and hypothesis properties."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.experiments import policies
from dask_research.experiments.gates import prune_reason, should_trigger_paper
from dask_research.experiments.policies import (
    greedy_scores,
    round_robin_scores,
    select,
    ucb1_score,
    ucb1_scores,
)


def test_policies_module_imports_nothing_from_dask():
    import ast
    import importlib
    import inspect
    import pkgutil

    from dask_research.experiments import gates

    modules = [policies, gates] + [importlib.import_module(f"{policies.__name__}.{m.name}")
                                   for m in pkgutil.iter_modules(policies.__path__)]
    for module in modules:
        tree = ast.parse(inspect.getsource(module))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not [n for n in names if n.startswith(("dask", "distributed", "asyncio"))], names


def test_ucb1_by_hand():
    # mean 0.5 after 2 of N=4 pulls, c = sqrt 2: 0.5 + sqrt(2 ln 4 / 2) = 0.5 + sqrt(ln 4)
    assert ucb1_score(0.5, runs=2, pending=0, total=4, c=2 ** 0.5) == pytest.approx(
        0.5 + math.sqrt(math.log(4)))
    s = ucb1_scores([0.5, 0.25, 0.0], [2, 1, 0], c=2 ** 0.5, total=4)
    assert s[0] == pytest.approx(0.5 + math.sqrt(math.log(4)))
    assert s[1] == pytest.approx(0.25 + math.sqrt(2 * math.log(4)))
    assert s[2] == math.inf


def test_pending_only_branch_is_finite_with_zero_mean():
    # one experiment in flight, no result: n = 1, mean taken as 0 -> the bonus alone
    assert ucb1_score(0.9, runs=0, pending=1, total=3, c=1.0) == pytest.approx(
        math.sqrt(math.log(3)))


def test_select_ties_go_to_insertion_order_and_skip_ineligible():
    assert select([2.0, 5.0, 5.0, 1.0], [True, True, True, True]) == 1
    assert select([2.0, 5.0, 5.0, 1.0], [True, False, True, True]) == 2
    assert select([math.inf, math.inf], [False, True]) == 1
    assert select([1.0, 2.0], [False, False]) is None
    assert select([-math.inf, -math.inf, 0.0], [False, True, False]) == 1


def test_gates():
    assert prune_reason(3, 0.19, 0, 3, 0.2, 3) == "low-mean"
    assert prune_reason(3, 0.2, 0, 3, 0.2, 3) is None          # not below the floor
    assert prune_reason(2, 0.0, 0, 3, 0.2, 3) is None          # too few runs
    assert prune_reason(0, 0.0, 3, 3, 0.2, 3) == "failures"
    assert prune_reason(0, 0.0, 9, 3, 0.2, None) is None       # no failure limit
    assert should_trigger_paper(1, 0.71, 0.7, False)
    assert not should_trigger_paper(1, 0.70, 0.7, False)       # must exceed
    assert not should_trigger_paper(1, 0.9, 0.7, True)         # once
    assert round_robin_scores([3, 1]).tolist() == [-3.0, -1.0]
    assert greedy_scores([0.2, 0.5], [1, 0]).tolist() == [0.2, math.inf]


# -- properties ---------------------------------------------------------------------------
branch_stats = st.integers(1, 30).flatmap(lambda k: st.tuples(
    st.lists(st.floats(0, 1), min_size=k, max_size=k),          # mean
    st.lists(st.integers(0, 20), min_size=k, max_size=k),       # runs
    st.lists(st.integers(0, 3), min_size=k, max_size=k),        # pending
    st.lists(st.booleans(), min_size=k, max_size=k),            # eligible
))


def _arrays(stats):
    mean, runs, pending, eligible = (np.array(x) for x in stats)
    mean = np.where(runs > 0, mean, 0.0)
    return mean, runs, pending, eligible


@given(branch_stats, st.floats(0, 5))
def test_vectorised_scores_equal_the_scalar_formula(stats, c):
    mean, runs, pending, _ = _arrays(stats)
    n = runs + pending
    total = int(n.sum())
    got = ucb1_scores(mean, n, c)
    want = [ucb1_score(m, r, p, total, c) for m, r, p in zip(mean, runs, pending)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@given(branch_stats, st.floats(0, 5))
def test_untried_eligible_branches_always_come_first(stats, c):
    mean, runs, pending, eligible = _arrays(stats)
    n = runs + pending
    pick = select(ucb1_scores(mean, n, c), eligible)
    untried = np.flatnonzero(eligible & (n == 0))
    if not eligible.any():
        assert pick is None
    elif len(untried):
        assert pick == untried[0]               # the first untried one, by insertion order
    else:
        assert eligible[pick]


@given(branch_stats, st.floats(0, 5))
def test_scores_are_finite_once_every_branch_has_a_pull(stats, c):
    mean, runs, pending, _ = _arrays(stats)
    n = np.maximum(runs + pending, 1)
    assert np.isfinite(ucb1_scores(mean, n, c)).all()


@given(st.integers(1, 8), st.integers(0, 8), st.floats(0.01, 5))
def test_pending_pulls_spread_parallel_slots_over_untried_branches(slots, extra, c):
    # `slots` decisions in a row with nothing completing: each pick becomes pending, so with at
    # least `slots` untried branches every slot gets a different branch.
    k = slots + extra
    mean, n = np.zeros(k), np.zeros(k)
    eligible = np.ones(k, bool)
    picks = []
    for _ in range(slots):
        i = select(ucb1_scores(mean, n, c), eligible)
        picks.append(i)
        n[i] += 1
    assert picks == list(range(slots))


@given(st.floats(0, 1), st.integers(1, 50), st.integers(2, 500), st.floats(0.01, 5))
def test_score_monotone_in_mean_and_decreasing_in_pulls(mean, runs, total, c):
    total = max(total, runs + 1)
    base = ucb1_score(mean, runs, 0, total, c)
    assert ucb1_score(min(mean + 0.1, 2.0), runs, 0, total, c) > base
    assert ucb1_score(mean, runs, 1, total, c) < base       # a pending pull lowers the bonus


@settings(max_examples=50)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.data())
def test_select_is_argmax_with_first_index_ties(scores, data):
    eligible = data.draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores)))
    pick = select(scores, eligible)
    cands = [i for i, e in enumerate(eligible) if e]
    if not cands:
        assert pick is None
    else:
        best = max(scores[i] for i in cands)
        assert pick == min(i for i in cands if scores[i] == best)
