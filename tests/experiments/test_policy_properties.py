"""Ledger-level properties of the new policies, driven by the shipped strategies."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.experiments import Result
from dask_research.experiments.ledger import BranchLedger
from dask_research.experiments.policies import POLICY_NAMES, dominates, make_policy
from dask_research.testing.experiments import hypotheses, reward_vectors

SCALAR = [p for p in POLICY_NAMES if p != "pareto-ucb1"]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SCALAR), hypotheses(features=2, max_size=20), st.data())
def test_every_policy_picks_a_queued_hypothesis_of_an_eligible_branch(policy, hyps, data):
    led = BranchLedger(1.0, make_policy(policy, seed=1))
    led.add(hyps)
    inflight = []
    while led.has_work():
        i, scores = led.select()
        assert led.eligible[i] and len(scores) == len(led.branches)
        queued = {h.id for h in led.queues[i]}
        h = led.pop(i)
        assert h.id in queued and h.branch == led.branches[i]
        inflight.append(h)
        if data.draw(st.booleans()):          # results arrive in any order
            done = inflight.pop(data.draw(st.integers(0, len(inflight) - 1)))
            led.record(Result(done, data.draw(st.floats(0, 1))))
    assert led.total_queued == 0 and led.in_flight == len(inflight)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4).flatmap(lambda d: st.tuples(
    st.just(d), st.lists(reward_vectors(d), min_size=1, max_size=12),
    st.lists(st.floats(0.1, 3), min_size=d, max_size=d))))
def test_vector_rewards_are_scalarised_with_the_weights(case):
    d, rewards, weights = case
    names = [f"o{j}" for j in range(d)]
    dirs = ["max" if j % 2 == 0 else "min" for j in range(d)]
    led = BranchLedger(1.0, make_policy("ucb1"), objectives=list(zip(names, dirs)), weights=weights)
    from dask_research.experiments import Hypothesis

    led.add([Hypothesis(f"h{k}", "a") for k in range(len(rewards))])
    for r in rewards:
        led.record(Result(led.pop(0), r))
    w = np.array(weights) / sum(weights)
    oriented = np.array([[x if dirs[j] == "max" else 1 - x for j, x in enumerate(r)]
                         for r in rewards])
    assert led.mean[0] == pytest.approx(float((oriented @ w).mean()))
    raw = led.raw_means(0)
    assert raw == pytest.approx({n: float(np.mean([r[j] for r in rewards]))
                                 for j, n in enumerate(names)})


@settings(max_examples=40, deadline=None)
@given(st.lists(reward_vectors(2), min_size=3, max_size=8), st.integers(0, 1000))
def test_pareto_ucb1_never_picks_a_dominated_index(means, seed):
    from dask_research.experiments import Hypothesis

    led = BranchLedger(1.0, make_policy("pareto-ucb1", seed=seed),
                       objectives=[("p", "max"), ("q", "max")])
    led.add([Hypothesis(f"h{j}-{k}", f"b{j}") for j in range(len(means)) for k in range(3)])
    for j, m in enumerate(means):             # one result per branch
        led.record(Result(led.take(f"b{j}", f"h{j}-0"), m))
    i, _ = led.select()
    idx = led.policy._indices
    assert not any(dominates(idx[j], idx[i]) for j in range(len(means)) if led.eligible[j])
    assert math.isfinite(idx[i][0])
