"""Lazy hypothesis sources (issue 17): Branch(name, propose=...) and the Optuna adapter."""
from __future__ import annotations

import pytest
from distributed.utils_test import gen_cluster

from dask_research.exceptions import ExperimentError
from dask_research.experiments import Branch, Hypothesis, IterationScheduler, Result

optuna = pytest.importorskip("optuna")


class Counting:
    """A source that counts its calls and records what it was told."""

    def __init__(self, values, limit=None):
        self.values = list(values)
        self.calls = 0
        self.seen: list[Result] = []
        self.limit = limit

    def propose(self, branch):
        self.calls += 1
        if self.limit is not None and self.calls > self.limit:
            return None
        return self.values[(self.calls - 1) % len(self.values)]

    def observe(self, result):
        self.seen.append(result)


def test_a_source_is_called_only_when_its_branch_is_picked_and_empty():
    """A search never pre-draws: proposals == experiments run, even with 3 slots."""
    a, b = Counting([0.9, 0.8]), Counting([0.3])
    sched = IterationScheduler(lambda h: h.payload, slots=3, progress=False,
                               max_experiments=20, prune_floor=0.0)
    sched.add([Branch("a", propose=a), Branch("b", propose=b)])
    r = sched.run()
    assert r.dispatched == r.total_runs == 20
    assert a.calls + b.calls == 20
    assert a.calls > b.calls                              # UCB1 prefers the better branch
    assert len(a.seen) == r.branches["a"].runs and all(x.ok for x in a.seen)
    assert {x.hypothesis.id for x in a.seen} == {f"a:{k}" for k in range(a.calls)}
    adds = [e for e in r.events if e.kind == "add" and e.data.get("source")]
    assert len(adds) == 20


def test_queued_hypotheses_of_a_source_branch_go_first():
    src = Counting([0.5])
    sched = IterationScheduler(lambda h: h.payload, slots=1, progress=False,
                               max_experiments=4)
    sched.add([Branch("a", propose=src), Hypothesis("mine", "a", 0.7)])
    r = sched.run()
    assert r.results[0].hypothesis.id == "mine"
    assert src.calls == 3 and [x.hypothesis.id for x in src.seen][0] == "mine"


def test_exhausted_and_failing_sources_end_their_branch():
    def boom(branch):
        raise RuntimeError("sampler broke")

    ok = Counting([0.5], limit=3)
    sched = IterationScheduler(lambda h: h.payload, slots=2, progress=False)
    sched.add([Branch("ok", propose=ok), Branch("bad", propose=boom)])
    r = sched.run()
    assert r.stop_reason == "queue_empty"
    assert r.branches["ok"].runs == 3 and r.branches["bad"].runs == 0
    errs = [e for e in r.events if e.kind == "add" and e.data.get("error")]
    assert len(errs) == 1 and errs[0].branch == "bad" and "sampler broke" in errs[0].data[
        "error"]


def test_a_source_whose_observe_raises_is_ended_not_the_run():
    class Bad(Counting):
        def observe(self, result):
            raise ValueError("cannot learn")

    bad, good = Bad([0.9]), Counting([0.5])
    sched = IterationScheduler(lambda h: h.payload, slots=1, progress=False,
                               max_experiments=6)
    sched.add([Branch("bad", propose=bad), Branch("good", propose=good)])
    r = sched.run()
    assert r.branches["bad"].runs == 1 and r.total_runs == 6
    err = next(e for e in r.events if e.kind == "add" and e.data.get("error"))
    assert err.branch == "bad" and "cannot learn" in err.data["error"]


def test_wrong_sources_are_clear_errors():
    with pytest.raises(ExperimentError, match="propose must be callable"):
        Branch("a", propose=42)
    sched = IterationScheduler(lambda h: 0.5, progress=False)
    sched.add(Branch("a", propose=lambda b: 0.5))
    with pytest.raises(ExperimentError, match="already has a source"):
        sched.add(Branch("a", propose=lambda b: 0.5))
    with pytest.raises(ExperimentError, match="picks among queued hypotheses"):
        IterationScheduler(lambda h: 0.5, progress=False, policy="linucb").add(
            Branch("a", propose=lambda b: 0.5))
    # a source proposing for another branch: its branch is ended with the error in the trace
    sched2 = IterationScheduler(lambda h: 0.5, progress=False)
    sched2.add(Branch("a", propose=lambda b: Hypothesis("x", "other")))
    r = sched2.run()
    assert r.total_runs == 0
    assert "other branches" in next(e for e in r.events if e.kind == "add").data["error"]


def test_ask_tell_with_sources():
    sched = IterationScheduler(None, progress=False, objective="max")
    sched.add([Branch("a", propose=lambda b: {"x": 1}), Branch("b", propose=lambda b: {"x": 2})])
    for _ in range(6):
        h = sched.ask()
        sched.tell(h, 0.9 if h.branch == "a" else 0.2)
    r = sched.report()
    assert r.total_runs == 6 and r.best == "a" and r.stop_reason == "ask_tell"


# -- OptunaSource -----------------------------------------------------------------------

SPACE = {"x": optuna.distributions.FloatDistribution(0.0, 1.0),
         "k": optuna.distributions.IntDistribution(1, 5)}


def quad(h):
    return max(0.0, 1.0 - (h.payload["x"] - 0.3) ** 2 - 0.05 * abs(h.payload["k"] - 2))


def search(seed, slots=2, n=24, objective="max"):
    from dask_research.experiments import OptunaSource

    sources = {b: OptunaSource(SPACE, seed=seed + k, startup=4) for k, b in enumerate("ab")}
    sched = IterationScheduler(quad, slots=slots, objective=objective, progress=False,
                               apply_order="dispatch", max_experiments=n)
    sched.add([Branch(b, propose=s) for b, s in sources.items()])
    return sched.run(), sources


def test_optuna_source_is_deterministic_under_a_seed():
    r1, _ = search(3)
    r2, _ = search(3)
    r3, _ = search(4)
    p = [[(x.hypothesis.id, x.hypothesis.payload) for x in r.results] for r in (r1, r2, r3)]
    assert p[0] == p[1]
    assert p[0] != p[2]


def test_optuna_source_learns_from_the_branch_results():
    r, sources = search(0, slots=1, n=40)
    for b, src in sources.items():
        trials = src.study.trials
        assert len(trials) == r.branches[b].runs
        assert all(t.state.name == "COMPLETE" for t in trials)
    assert r.best_result.reward > 0.99          # TPE found the optimum region x ~ 0.3, k = 2


def test_optuna_source_continues_after_resume(tmp_path):
    from dask_research.experiments import OptunaSource

    path = tmp_path / "opt.jsonl"
    s1 = IterationScheduler(quad, slots=1, objective="max", progress=False, checkpoint=path,
                            max_experiments=8)
    s1.add(Branch("a", propose=OptunaSource(SPACE, seed=1)))
    s1.run()
    src = OptunaSource(SPACE, seed=1)
    s2 = IterationScheduler.resume(path, quad, max_experiments=None)
    s2.add(Branch("a", propose=src))            # functions are not journaled: add it again
    assert len(src.study.trials) == 8           # the restored results were told to the study
    s2.max_experiments = 12
    r = s2.run()
    ids = [x.hypothesis.id for x in r.results]
    assert len(ids) == len(set(ids)) == 12      # no id proposed twice across the resume
    assert len(src.study.trials) == 12


def _payload_reward(h):
    return h.payload["x"]


@gen_cluster(client=True, timeout=60)
async def test_sources_and_max_objective_on_dask_workers(c, s, a, b):
    """Sources propose on the driver, experiments run as Dask futures on the workers, and a
    seeded search with apply_order="dispatch" makes the same decisions as without a client."""
    from dask_research.experiments import OptunaSource

    def make(client):
        sched = IterationScheduler(_payload_reward, slots=3, client=client, objective="max",
                                   apply_order="dispatch", progress=False, max_experiments=12,
                                   log_events=False)
        sched.add([Branch(n, propose=OptunaSource(
            {"x": optuna.distributions.FloatDistribution(lo, lo + 0.5)}, seed=k))
            for k, (n, lo) in enumerate([("low", 0.0), ("high", 0.5)])])
        return sched

    remote = await make(c).run_async()
    local = make(None).run()
    assert remote.total_runs == 12 and remote.best == "high"
    assert [r.hypothesis.payload for r in remote.results] == [
        r.hypothesis.payload for r in local.results]


def test_optuna_source_unique_never_proposes_a_configuration_twice():
    from dask_research.exceptions import InputError
    from dask_research.experiments import OptunaSource

    grid = {"a": optuna.distributions.IntDistribution(0, 3),
            "b": optuna.distributions.CategoricalDistribution(["x", "y"])}
    src = OptunaSource(grid, seed=0, startup=2, unique=True)
    sched = IterationScheduler(lambda h: (h.payload["a"] + 4 * (h.payload["b"] == "y")) / 8,
                               slots=2, objective="max", progress=False,
                               apply_order="dispatch", max_experiments=20)
    sched.add(Branch("g", propose=src))
    r = sched.run()
    seen = [tuple(sorted(x.hypothesis.payload.items())) for x in r.results]
    assert len(seen) == len(set(seen)) == 8            # every configuration once, then done
    assert r.stop_reason == "queue_empty" and r.best_result.reward == 7 / 8
    with pytest.raises(InputError):
        OptunaSource(SPACE, unique=True)               # a float range is not finite
