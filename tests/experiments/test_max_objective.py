"""objective="max" (issue 17): max-bandit policies, gates for the best-of-branch objective,
report.best under the run's objective, checkpoint resume of a max run."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dask_research.exceptions import InputError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.policies import (
    QuantileUCBPolicy,
    ThresholdAscentPolicy,
    quantile_ucb_index,
    threshold_ascent_index,
)
from dask_research.experiments.policies.maxbandit import (
    max_prune_reason,
    should_trigger_paper_max,
)


def table_runner(h: Hypothesis) -> float:
    return float(h.payload)


# The situation of issue 17: the best family ("svc") opens with catastrophic configurations
# (0.16, as an SVC with a tiny gamma and C scores), then holds the best configurations; the
# other families are steady and good on average.
SVC = [0.16, 0.16, 0.16, 0.99, 0.985, 0.2, 0.97, 0.99]
STEADY = {"logreg": [0.90, 0.91, 0.90, 0.92, 0.91, 0.90, 0.91, 0.90],
          "knn": [0.93, 0.94, 0.93, 0.95, 0.94, 0.93, 0.94, 0.93]}


def issue_hypotheses() -> list[Hypothesis]:
    draws = {"svc": SVC, **STEADY}
    return [Hypothesis(f"{b}{k}", b, v) for k in range(8) for b, vals in draws.items()
            for v in [vals[k]]]


# -- pure functions ----------------------------------------------------------------------

def test_quantile_index_is_robust_to_one_catastrophic_draw():
    good = sorted([0.95, 0.97, 0.98, 0.99])
    bad_once = sorted([0.16, 0.95, 0.97, 0.98, 0.99])
    steady = sorted([0.92] * 5)
    for c in (0.0, 0.25):
        assert quantile_ucb_index(bad_once, 0, 40, 0.7, c) >= quantile_ucb_index(good, 0, 40,
                                                                                   0.7, c)
        assert quantile_ucb_index(bad_once, 0, 40, 0.7, c) > quantile_ucb_index(steady, 0, 40,
                                                                                  0.7, c)
    # the mean ranks them the other way round: what buried the family under UCB1
    assert np.mean(bad_once) < np.mean(steady)


def test_quantile_index_properties():
    r = sorted(np.random.default_rng(0).uniform(size=20).tolist())
    # more confidence width never lowers the bound; more pulls elsewhere (larger N) neither
    assert quantile_ucb_index(r, 0, 100, 0.8, 0.5) >= quantile_ucb_index(r, 0, 100, 0.8, 0.1)
    assert quantile_ucb_index(r, 0, 1000, 0.8, 0.3) >= quantile_ucb_index(r, 0, 100, 0.8, 0.3)
    # pending pulls count as draws at the bottom: they lower (never raise) the bound
    assert quantile_ucb_index(r, 3, 100, 0.5, 0.0) <= quantile_ucb_index(r, 0, 100, 0.5, 0.0)
    # untried: +inf; a level past 1: above the range, less-tried branches first
    assert quantile_ucb_index([], 0, 10, 0.8, 0.5) == math.inf
    one, three = quantile_ucb_index([0.1], 0, 10, 0.8, 0.5), quantile_ucb_index(
        [0.1] * 3, 0, 10, 0.8, 0.5)
    assert one > three > 1.0


def test_threshold_ascent_index():
    assert threshold_ascent_index(0, 0, 2.0) == math.inf
    # more hits, higher bound; more pulls at the same rate, tighter bound
    assert threshold_ascent_index(3, 10, 2.0) > threshold_ascent_index(1, 10, 2.0)
    assert threshold_ascent_index(2, 10, 2.0) > threshold_ascent_index(20, 100, 2.0) > 0.2


def test_max_prune_rule():
    # three catastrophic draws do not prune under "max" (the bound is not informative yet)
    assert max_prune_reason(1, [0.16] * 3, 0.95, 0, 3, 0, 30, 0.8, 0.5, 3, None) is None
    # many draws that never come near the best seen: pruned, with the max reason
    assert max_prune_reason(1, [0.16] * 40, 0.95, 0, 40, 0, 200, 0.8, 0.5, 3,
                            None) == "no-better-best"
    # the record holder is never pruned; failures prune as under "mean"
    assert max_prune_reason(0, [0.16] * 40, 0.16, 0, 40, 0, 200, 0.8, 0.5, 3, None) is None
    assert max_prune_reason(1, [0.9], 0.95, 0, 1, 3, 10, 0.8, 0.5, 3, 3) == "failures"


def test_paper_gate_follows_records():
    assert should_trigger_paper_max(0.95, 0.95, 0.7, False)
    assert not should_trigger_paper_max(0.93, 0.95, 0.7, False)   # not the best so far
    assert not should_trigger_paper_max(0.6, 0.6, 0.7, False)     # below the threshold
    assert not should_trigger_paper_max(0.95, 0.95, 0.7, True)    # once per branch


# -- the scheduler -------------------------------------------------------------------------

def test_mean_objective_buries_the_best_family_max_does_not():
    """The failure of issue 17, reproduced: under "mean" the prune floor buries the family
    holding the best configuration after three bad draws; under "max" it is kept, run again,
    and reported as the best branch with the best hypothesis."""
    mean = IterationScheduler(table_runner, slots=1, progress=False, max_experiments=18)
    mean.add(issue_hypotheses())
    r_mean = mean.run()
    assert r_mean.branches["svc"].pruned == "low-mean"
    assert r_mean.best != "svc"

    for policy in ("quantile-ucb", "threshold-ascent"):
        sched = IterationScheduler(table_runner, slots=1, progress=False, max_experiments=18,
                                   objective="max", max_policy=policy)
        sched.add(issue_hypotheses())
        r = sched.run()
        assert r.objective == "max" and r.policy == policy
        assert r.branches["svc"].pruned is None
        assert r.branches["svc"].runs >= 4, (policy, r.branches["svc"])
        assert r.best == "svc"
        assert r.best_result.reward == 0.99 and r.best_result.hypothesis.branch == "svc"
        assert r.branches["svc"].best == 0.99
        assert r.branches["svc"].best_hypothesis in ("svc3", "svc7")
        d = r.to_dict(events=False)
        assert d["objective"] == "max" and d["best"] == "svc"


def test_max_paper_trigger_fires_for_record_holders_only():
    sched = IterationScheduler(table_runner, slots=1, progress=False, objective="max",
                               paper_threshold=0.8)
    sched.add(issue_hypotheses())
    r = sched.run()
    # "mean" with the same threshold fires for every steady family; "max" only for branches
    # that set a record above it, each once
    assert len(set(r.paper_triggers)) == len(r.paper_triggers)
    assert "svc" in r.paper_triggers
    assert r.paper_triggers[-1] == "svc"          # the last record is svc's 0.99
    for ev in r.events.of_kind("paper.trigger") if hasattr(r.events, "of_kind") else [
            e for e in r.events if e.kind == "paper.trigger"]:
        assert ev.branch in r.paper_triggers


def test_report_best_under_mean_is_the_best_mean():
    sched = IterationScheduler(table_runner, slots=1, progress=False, prune_floor=0.0)
    sched.add(issue_hypotheses())
    r = sched.run()
    assert r.objective == "mean" and r.best == "knn"        # highest mean
    assert r.best_result.reward == 0.99                     # the best hypothesis is svc's


def test_max_policy_is_the_configured_default():
    s = IterationScheduler(table_runner, progress=False, objective="max")
    assert isinstance(s.policy, ThresholdAscentPolicy)      # the measured default
    s = IterationScheduler(table_runner, progress=False, objective="max",
                           max_policy="quantile-ucb", max_quantile=0.7)
    assert isinstance(s.policy, QuantileUCBPolicy)
    assert (s.policy.tau, s.policy.c) == (0.7, s.max_c)


@pytest.mark.parametrize("kwargs,name", [
    ({"objective": "best"}, "objective"),
    ({"objective": "max", "max_policy": "ucb9"}, "max_policy"),
    ({"objective": "max", "max_quantile": 1.0}, "max_quantile"),
    ({"objective": "max", "max_c": -1}, "max_c"),
    ({"objective": "max", "objectives": {"acc": "max", "cost": "min"}}, "objective"),
])
def test_bad_settings_are_input_errors(kwargs, name):
    with pytest.raises(InputError) as err:
        IterationScheduler(table_runner, progress=False, **kwargs)
    assert name in str(err.value)


def test_config_sets_the_objective():
    import dask

    with dask.config.set({"research.experiments.objective": "max",
                          "research.experiments.max-policy": "threshold-ascent"}):
        s = IterationScheduler(table_runner, progress=False)
    assert s.objective == "max" and s.policy.name == "threshold-ascent"


@pytest.mark.parametrize("policy", ["quantile-ucb", "threshold-ascent"])
def test_max_run_resumes_from_its_journal(tmp_path, policy):
    """A max run stopped by its budget resumes with the policy's per-branch rewards rebuilt:
    the resumed scheduler scores branches exactly as the original would have."""
    path = tmp_path / "max.jsonl"
    a = IterationScheduler(table_runner, slots=1, progress=False, objective="max",
                           max_policy=policy, checkpoint=path, max_experiments=9)
    a.add(issue_hypotheses())
    a.run()
    b = IterationScheduler.resume(path, table_runner, max_experiments=None)
    assert b.objective == "max" and b.policy.name == policy
    assert b.policy.sorted == a.policy.sorted
    np.testing.assert_array_equal(b.ledger.scores(), a.ledger.scores())
    assert b.ledger.holder == a.ledger.holder and b.ledger.best_seen == a.ledger.best_seen
    r = b.run()
    assert r.total_runs == 24 and r.best == "svc"


def test_threshold_ascent_large_delta_is_greedy_not_a_crash():
    """delta beyond 2NK made alpha negative (math domain error in the bound): it is clamped."""
    sched = IterationScheduler(table_runner, slots=3, progress=False, objective="max",
                               policy=ThresholdAscentPolicy(top=2, delta=1e9))
    sched.add(issue_hypotheses())
    r = sched.run()
    assert r.total_runs == 24
    for bad in ({"top": 0}, {"top": 2.5}, {"delta": 0}, {"delta": float("nan")}):
        with pytest.raises(InputError):
            ThresholdAscentPolicy(**bad)


def test_threshold_ascent_window_counts_recent_hits_only():
    """A branch whose last results missed the threshold loses its rate under window=, not
    without it; an unbounded policy with an untried branch scores it (no IndexError)."""
    from dask_research.experiments import Result
    from dask_research.experiments.ledger import BranchLedger

    def ledger(policy):
        led = BranchLedger(c=1.0, policy=policy)
        led.add([Hypothesis(f"{b}{j}", b) for b in "ab" for j in range(8)])
        for b, rewards in (("a", [0.9, 0.9, 0.9, 0.1, 0.1, 0.1]),
                           ("b", [0.5, 0.5, 0.5, 0.5, 0.5, 0.92])):
            for r in rewards:
                i = led.branch_index(b)
                h = led.pop(i)
                led.record(Result(h, r))
        return led

    whole = ledger(ThresholdAscentPolicy(top=4, delta=10.0))
    recent = ledger(ThresholdAscentPolicy(top=4, delta=10.0, window=3))
    assert whole.scores()[0] > whole.scores()[1]          # a holds 3 of the top 4
    assert recent.scores()[0] < recent.scores()[1]        # but not lately
    assert ThresholdAscentPolicy(window=3).params() == {"top": 5, "delta": 0.1, "window": 3}
    for bad in (0, 2.5, True):
        with pytest.raises(InputError):
            ThresholdAscentPolicy(window=bad)
    led = BranchLedger(c=1.0, policy=ThresholdAscentPolicy(bounded=False))
    led.add([Hypothesis("a0", "a"), Hypothesis("b0", "b")])
    led.record(Result(led.pop(0), 0.5))
    assert math.isinf(led.scores()[1])
