"""The new policies, vector rewards and dispatch-order application inside the scheduler."""
import asyncio
import math
import random

import pytest

from dask_research.exceptions import ExperimentError, InputError
from dask_research.experiments import (
    Hypothesis,
    IterationScheduler,
    Result,
    make_deterministic_runner,
)
from dask_research.experiments.policies import POLICY_NAMES
from dask_research.experiments.recorder import log_records


def _hyps(branches, per_branch, features=False):
    return [Hypothesis(f"{b}{k}", b, features=(k / per_branch, 1.0) if features else None)
            for k in range(per_branch) for b in branches]


@pytest.mark.parametrize("policy", [p for p in POLICY_NAMES if p != "pareto-ucb1"])
def test_every_named_policy_runs_and_spreads_slots(policy):
    runner = make_deterministic_runner({"a": 0.8, "b": 0.5, "c": 0.3, "d": 0.2}, delay_ms=1)
    sched = IterationScheduler(runner, slots=3, policy=policy, progress=False, prune_floor=0.0,
                               paper_threshold=1.0)
    sched.add(_hyps("abcd", 5, features=True))
    report = sched.run()
    assert report.stop_reason == "queue_empty" and report.total_runs == 20
    assert report.policy == policy and report.events.max_concurrency() == 3
    if policy not in ("thompson", "linucb", "linucb-hybrid"):
        assert len({e.branch for e in report.events.of("select")[:3]}) == 3


def test_policy_names_and_parameters_are_checked():
    with pytest.raises(InputError, match=r"policy='ucb2' is invalid; expected one of 'ucb1'"):
        IterationScheduler(lambda h: 0.5, policy="ucb2")
    with pytest.raises(InputError, match=r"gamma=1.5 is invalid; expected a number in \(0, 1\]"):
        IterationScheduler(lambda h: 0.5, policy="discounted-ucb", gamma=1.5)
    with pytest.raises(InputError, match=r"KL-UCB needs rewards in \[0, 1\]"):
        IterationScheduler(lambda h: 0.5, policy="kl-ucb", bounded=False, prune_floor=0,
                           paper_threshold=1)
    with pytest.raises(InputError, match=r"apply_order='random' is invalid"):
        IterationScheduler(lambda h: 0.5, apply_order="random")
    with pytest.raises(ExperimentError, match="needs vector rewards; declare them"):
        IterationScheduler(lambda h: 0.5, policy="pareto-ucb1")
    sched = IterationScheduler(lambda h: 0.5, policy="linucb")
    with pytest.raises(ExperimentError, match=r"policy 'linucb' needs Hypothesis.features, but "
                                              r"'x' has none"):
        sched.add([Hypothesis("x", "a")])
    sched.add([Hypothesis("y", "a", features=(1.0, 2.0))])
    with pytest.raises(ExperimentError, match=r"features of 'z' are \(1.0,\); expected 2"):
        sched.add([Hypothesis("z", "a", features=(1.0,))])


def test_linucb_picks_a_hypothesis_not_the_oldest():
    # reward = the first feature; the best hypothesis of branch a is queued last
    run = make_deterministic_runner(lambda h: h.features[0], delay_ms=0)
    sched = IterationScheduler(run, slots=1, policy="linucb", alpha=0.1, progress=False,
                               prune_floor=0.0, paper_threshold=1.0)
    sched.add([Hypothesis(f"a{k}", "a", features=(k / 10, 1.0)) for k in range(10)])
    report = sched.run()
    picks = [e.hypothesis for e in report.events.of("select")]
    assert picks[0] == "a9" and picks[:3] == ["a9", "a8", "a7"]     # greedy on x . theta
    assert report.events.of("select")[1].data["position"] == 8


def test_linucb_pending_pulls_narrow_the_width_so_slots_spread():
    run = make_deterministic_runner({"a": 0.5, "b": 0.5}, delay_ms=5)
    sched = IterationScheduler(run, slots=2, policy="linucb", alpha=2.0, progress=False,
                               prune_floor=0.0, paper_threshold=1.0)
    sched.add([Hypothesis(f"{b}{k}", b, features=(1.0,)) for k in range(3) for b in "ab"])
    report = sched.run()
    assert [e.branch for e in report.events.of("select")[:2]] == ["a", "b"]


def test_hybrid_linucb_transfers_to_a_new_branch():
    # reward = feature 0 on every branch: the shared coefficients learn it on a and b, so on the
    # untried branch c the hybrid model already prefers the high-feature hypothesis
    run = make_deterministic_runner(lambda h: h.features[0], delay_ms=0)
    sched = IterationScheduler(run, slots=1, policy="linucb-hybrid", alpha=0.05,
                               progress=False, prune_floor=0.0, paper_threshold=1.0)
    sched.add([Hypothesis(f"{b}{k}", b, features=(k / 5, 1.0)) for k in range(6) for b in "ab"])
    sched.run()
    sched.add([Hypothesis("c-low", "c", features=(0.0, 1.0)),
               Hypothesis("c-high", "c", features=(1.0, 1.0))])
    model = sched.policy.model
    low, high = model.scores("c", [[0.0, 1.0], [1.0, 1.0]])
    assert high - low > 0.3
    disjoint = IterationScheduler(run, slots=1, policy="linucb", alpha=0.05, progress=False,
                                  prune_floor=0.0, paper_threshold=1.0)
    disjoint.add([Hypothesis(f"{b}{k}", b, features=(k / 5, 1.0)) for k in range(6)
                  for b in "ab"])
    disjoint.run()
    low, high = disjoint.policy.model.scores("c", [[0.0, 1.0], [1.0, 1.0]])
    assert abs(high - low) < 0.05          # a disjoint model knows nothing about c


def test_discounted_ucb_follows_a_drifting_branch_faster_than_ucb1():
    def late_b_share(policy):
        calls = []

        def drift(h):       # a is best for the first 150 experiments, then b is
            calls.append(h.id)
            late = len(calls) > 150
            return {"a": 0.3 if late else 0.8, "b": 0.6 if late else 0.3}[h.branch]

        sched = IterationScheduler(drift, slots=1, policy=policy, gamma=0.95, c=0.5,
                                   progress=False, prune_floor=0.0, paper_threshold=1.0,
                                   max_experiments=300)
        sched.add([Hypothesis(f"{b}{k}", b) for k in range(300) for b in "ab"])
        picks = sched.run().events.picks()
        return picks[150:300].count("b") / 150

    # measured: 0.80 with discounting, 0.52 without
    assert late_b_share("discounted-ucb") > late_b_share("ucb1") + 0.2


def _random_durations(seed):
    rng = random.Random(seed)
    rewards = {f"{b}{k}": round((ord(b) * 37 + k * 11) % 100 / 100, 2)
               for b in "abcdef" for k in range(8)}

    async def runner(h):
        await asyncio.sleep(rng.uniform(0.0, 0.01))
        return rewards[h.id]

    return runner


@pytest.mark.parametrize("policy", ["ucb1", "thompson"])
def test_dispatch_order_makes_the_same_decisions_whatever_the_completion_order(policy):
    def run(seed, order):
        sched = IterationScheduler(_random_durations(seed), slots=3, policy=policy,
                                   apply_order=order, progress=False, prune_after_runs=2,
                                   prune_floor=0.3, paper_threshold=0.8)
        sched.add(_hyps("abcdef", 8))
        return sched.run()

    reports = [run(seed, "dispatch") for seed in range(3)]
    picks = [[e.hypothesis for e in r.events.of("select")] for r in reports]
    assert picks[0] == picks[1] == picks[2]
    assert reports[0].branches == reports[1].branches == reports[2].branches
    assert [e.branch for e in reports[0].events.of("prune")] == [
        e.branch for e in reports[2].events.of("prune")]
    # results are counted in dispatch order even though they finished in another order
    tr = reports[0].events
    finished = [e.hypothesis for e in tr.of("finish")]
    counted = [e.hypothesis for e in tr.of("result", "failure")]
    dispatched = [e.hypothesis for e in tr.of("dispatch")]
    assert counted == dispatched and sorted(finished) == sorted(dispatched)
    assert finished != dispatched                       # the durations did reorder them
    assert 0 < tr.occupancy() <= 1 and tr.max_concurrency() == 3
    # with completion order, the decisions follow the completions (usually differ)
    completion = {tuple(e.hypothesis for e in run(s, "completion").events.of("select"))
                  for s in range(3)}
    assert len(completion) >= 1


def test_vector_rewards_pareto_ucb1_front_and_per_objective_gates():
    levels = {"fast": (0.6, 0.1), "accurate": (0.9, 0.7), "balanced": (0.75, 0.3),
              "bad": (0.5, 0.8), "weak": (0.1, 0.2)}

    def runner(h):
        acc, cost = levels[h.branch]
        return Result(h, {"accuracy": acc, "cost": cost}, {"note": "dict reward"})

    sched = IterationScheduler(runner, slots=2, policy="pareto-ucb1", seed=3, progress=False,
                               objectives={"accuracy": "max", "cost": "min"},
                               prune_floor={"accuracy": 0.3}, prune_after_runs=2,
                               paper_threshold={"accuracy": 0.7, "cost": 0.35})
    sched.add(_hyps(levels, 6))
    report = sched.run()
    assert report.pareto_front == ["fast", "accurate", "balanced"]
    assert report.branches["weak"].pruned == "low-accuracy"
    assert report.paper_triggers == ["balanced"]
    assert report.branches["accurate"].means == pytest.approx({"accuracy": 0.9, "cost": 0.7})
    assert report.results[0].reward in levels.values()          # stored as a tuple
    sel = report.events.of("select")[-1]
    assert set(sel.data["front"]) <= set(levels)
    assert "Pareto front: fast (accuracy 0.600, cost 0.100)" in str(report)
    d = report.to_dict(events=False)
    assert d["objectives"] == {"accuracy": "max", "cost": "min"}
    assert [r["branch"] for r in d["pareto_front"]] == report.pareto_front
    # bad is dominated by accurate on both objectives: Pareto UCB1 pulls it least
    runs = {b: s.runs for b, s in report.branches.items()}
    assert runs["bad"] <= min(runs["fast"], runs["accurate"], runs["balanced"])


def test_vector_rewards_with_weights_and_scalar_thresholds():
    runner = make_deterministic_runner(lambda h: 0.0, delay_ms=0)

    def vec(h):
        return (0.9, 0.9) if h.branch == "a" else [0.5, 0.1]

    sched = IterationScheduler(vec, slots=1, objectives=["q", ("cost", "min")],
                               weights={"q": 3, "cost": 1}, progress=False,
                               prune_floor=0.2, paper_threshold=0.6)
    sched.add(_hyps("ab", 3))
    report = sched.run()
    # a: 0.75 * 0.9 + 0.25 * (1 - 0.9) = 0.7; b: 0.75 * 0.5 + 0.25 * 0.9 = 0.6
    assert report.branches["a"].mean == pytest.approx(0.7)
    assert report.branches["b"].mean == pytest.approx(0.6)
    assert report.paper_triggers == ["a"] and runner is not None


def test_bad_vector_rewards_fail_the_experiment():
    out = {"short": (0.5,), "nan": (0.5, math.nan), "big": (0.5, 2.0), "keys": {"x": 1.0},
           "scalar": 0.5}
    sched = IterationScheduler(lambda h: out[h.id], objectives=["p", "q"], progress=False,
                               failure_limit=0)
    sched.add([Hypothesis(i, "z") for i in out])
    errors = {r.hypothesis.id: r.error for r in sched.run().failed}
    assert "expected 2 finite numbers (p, q)" in errors["short"]
    assert "expected 2 finite numbers" in errors["nan"]
    assert "bounded rewards must lie in [0, 1]" in errors["big"]
    assert "expected exactly the objectives p, q" in errors["keys"]
    assert "expected a vector of 2 numbers (p, q)" in errors["scalar"]
    with pytest.raises(InputError, match=r"objectives=\['solo'\] is invalid"):
        IterationScheduler(lambda h: 0.5, objectives=["solo"])
    with pytest.raises(InputError, match=r"prune_floor=\{'zz': 0.1\} is invalid"):
        IterationScheduler(lambda h: 0.5, objectives=["p", "q"], prune_floor={"zz": 0.1})
    with pytest.raises(InputError, match=r"weights=\[1\] is invalid; expected 2 numbers"):
        IterationScheduler(lambda h: 0.5, objectives=["p", "q"], weights=[1])


def test_dask_log_records_stay_compatible_for_the_dashboard():
    from dask_research.dashboard.folds import branch_view

    sched = IterationScheduler(_random_durations(1), slots=3, apply_order="dispatch",
                               policy="kl-ucb", progress=False)
    sched.add(_hyps("abc", 4))
    report = sched.run()
    records = log_records(report.events, 0, report.run_id)
    view = branch_view([(0, {"event": "batch", "run": report.run_id, "events": records})])
    assert view is not None and set(view["branches"]) == {"a", "b", "c"}
    assert sum(b["runs"] for b in view["branches"].values()) == 12
    assert all("scores" in r for r in records if r["event"] == "select")
