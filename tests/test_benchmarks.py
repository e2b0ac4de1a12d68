"""The benchmarks' shared parts: what an absent optional dependency does, how a section of
``bench_experiments`` runs alone, and that the sections together accept the old command line."""
import json
import sys

import pytest

from benchmarks import bench_experiments, harness
from benchmarks.experiment_simulation import SUITE_K, SUITE_STRATEGIES, Problem, simulate
from benchmarks.experiment_workloads import hypotheses, median_of, refill_gaps


def test_missing_names_the_first_absent_module():
    assert harness.missing("json", "numpy") is None
    assert harness.missing("json", "no_such_module_here", "neither_this") == "no_such_module_here"


def test_require_skipping_prints_one_line_and_goes_on(capsys):
    assert harness.require("json", benchmark="bench_x") is True
    assert harness.require("no_such_module_here", benchmark="bench_x", skipping="the curves") is False
    out = capsys.readouterr().out
    assert out.splitlines() == ["bench_x: skipping the curves: no_such_module_here is not installed "
                                "(pip install -e '.[bench]')"]


def test_require_without_skipping_ends_the_benchmark_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        harness.require("no_such_module_here", benchmark="bench_x")
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == ("bench_x: cannot run: no_such_module_here is not "
                                               "installed (pip install -e '.[bench]')")


def test_a_missing_bokeh_is_one_line_not_a_crash(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "bokeh", None)      # find_spec: ValueError, as if absent
    assert harness.require("bokeh", benchmark="bench_experiments_suite",
                           skipping="the regret curves") is False
    assert "bokeh is not installed" in capsys.readouterr().out


def test_run_section_merges_only_its_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    harness.write_results("bench_demo", {"kept": 1, "mine": 0})
    seen = {}

    def add_arguments(ap):
        ap.add_argument("--size", type=int, default=3)

    def measure(args):
        seen.update(quick=args.quick, size=args.size)
        return {"mine": args.size}

    path = harness.run_section("bench_demo", "a demo", add_arguments, measure, argv=["--quick", "--size", "5"])
    assert seen == {"quick": True, "size": 5}
    doc = json.loads(path.read_text())
    assert doc["figures"] == {"kept": 1, "mine": 5} and list(doc["updated"]) == ["mine"]
    assert "wrote" in capsys.readouterr().out


def test_the_umbrella_takes_every_option_of_the_sections():
    import argparse

    ap = argparse.ArgumentParser()
    for section in bench_experiments.SECTIONS:
        section.add_arguments(ap)
    args = ap.parse_args(["--seeds", "7", "--optuna-seeds-300", "2", "--optuna-seeds-3000", "1",
                          "--memory-experiments", "100"])
    assert (args.seeds, args.optuna_seeds_300, args.optuna_seeds_3000, args.memory_experiments) == (7, 2, 1, 100)
    names = [s.__name__.rsplit(".", 1)[1] for s in bench_experiments.SECTIONS]
    assert names == ["bench_experiments_decision", "bench_experiments_occupancy", "bench_experiments_bandit",
                     "bench_experiments_suite", "bench_experiments_costs", "bench_experiments_memory"]


def test_workloads():
    hs = hypotheses(5, 2, prefix="x")
    assert [h.id for h in hs] == ["x0", "x1", "x2", "x3", "x4"] and {h.branch for h in hs} == {"b0", "b1"}
    assert median_of([{"a": 1, "b": 5}, {"a": 3, "b": 4}, {"a": 2, "b": 6}]) == {"a": 2, "b": 5}

    class Ev:
        def __init__(self, kind, t, slot, queued=1):
            self.kind, self.t, self.slot, self.data = kind, t, slot, {"queued": queued}

    class Report:
        events = [Ev("result", 1.0, 0), Ev("dispatch", 1.25, 0), Ev("result", 2.0, 1, queued=0),
                  Ev("dispatch", 2.5, 1)]

    assert refill_gaps(Report()) == [0.25]          # a result with nothing queued frees no slot


def test_the_simulation_is_deterministic_per_seed():
    pytest.importorskip("scipy")
    a = simulate(SUITE_STRATEGIES["greedy"](SUITE_K, 3), Problem("clipped-gaussian", 3, horizon=90), 90)
    b = simulate(SUITE_STRATEGIES["greedy"](SUITE_K, 3), Problem("clipped-gaussian", 3, horizon=90), 90)
    assert a["regret"] == b["regret"] and list(a["curve"]) == list(b["curve"])


def test_the_multiprocess_numpy_peer_computes_what_the_single_process_one_and_ours_do():
    """bench_montecarlo's (a'), NumPy on every core, folds the same shards to the same estimate
    as (a) and as our block kernel, so its time is a like-for-like peer."""
    from multiprocessing.pool import ThreadPool  # the same fold; no fork of a threaded test worker

    import numpy as np

    from benchmarks import bench_montecarlo as bm
    from dask_research.montecarlo.shard_compute import compute_block

    single = bm.numpy_single(5, 2048)
    with ThreadPool(2) as pool:
        parallel = bm.numpy_processes(pool, 2, 5, 2048)
    job = bm.make_job(5, 2048)
    ours = compute_block(job, job.make_reducer(job.range), 0, 5).state
    for mean, var, hist in (single, parallel):
        assert np.isclose(mean, ours.mean, rtol=1e-12) and np.isclose(var, ours.m2 / (ours.n - 1), rtol=1e-10)
        assert (hist == ours.hist[1:-1]).all(), (hist, ours.hist)   # ours: under- and overflow at the ends


def test_the_fault_benchmark_sums_up_its_runs_per_system_phase_and_kill_point():
    """bench_experiments_faults repeats every fault at several kill points and phases; its summary
    keeps each group's best, median and worst, and counts runs beyond the budget as extra."""
    import collections

    from benchmarks import bench_experiments_faults as bf

    def run(system, phase, kill_at, executions, counted=24, lost=0, twice=()):
        return {"fault": "worker killed", "system": system, "phase": phase, "kill_at": kill_at,
                "figures": bf._figures(counted, lost, collections.Counter(
                    {f"h{i}": 1 + (f"h{i}" in twice) for i in range(executions - len(twice))}))}

    runs = [run("ours", "end", 0.25, 25, twice=("h3",)), run("ours", "mid", 0.75, 26, twice=("h3", "h4")),
            run("peer", "end", 0.25, 27, counted=27), run("peer", "mid", 0.75, 34, counted=33, lost=1)]
    total = bf.summarize(runs)
    assert set(total) == {"worker killed|ours", "worker killed|peer"}
    ours, peer = total["worker killed|ours"], total["worker killed|peer"]
    assert ours["extra_runs"] == [1, 1.5, 2] and ours["over_budget_max"] == 0 and ours["max_run_twice"] == 2
    assert ours["budget_met_in"] == "2 of 2" and ours["runs_with_a_trial_run_twice"] == 2
    assert peer["over_budget_max"] == 9 and peer["runs_over_budget"] == 2 and peer["lost"] == [0, 0.5, 1]
    assert peer["extra_runs"] == [3, 6.5, 10] and peer["runs_with_a_trial_run_twice"] == 0
    by_point = bf.summarize(runs, ("system", "kill_at"))
    assert by_point["peer|0.75"]["extra_runs"] == [10, 10, 10] and by_point["ours|0.25"]["runs"] == 1
    by_phase = bf.summarize(runs, ("system", "phase"))
    assert by_phase["ours|mid"]["max_run_twice"] == 2 and by_phase["peer|end"]["over_budget_max"] == 3
    assert "ahead_dispatches" not in ours          # only where every run counted them
    for r in runs[:2]:
        r["figures"]["ahead_dispatches"] = 22
    assert bf.summarize(runs)["worker killed|ours"]["ahead_dispatches"] == [22, 22, 22]


def test_the_fault_benchmark_refuses_a_selection_in_one_line_naming_each_bad_value():
    import pytest

    from benchmarks import bench_experiments_faults as bf

    ok = bf.selection("ours,optuna,ours", "driver,worker", "0.25,0.75", "mid", 2, "1")
    assert ok == {"systems": ["ours", "optuna"], "faults": ["worker killed", "driver killed, resumed"],
                  "kill_at": [0.25, 0.75], "phases": ["mid"], "queue_ahead": 1}
    with pytest.raises(ValueError) as e:
        bf.selection("ours,nope", "worker,bogus", "0.5,x,0.01", "end,late", 0, "some")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("not valid: ")
    for part in ("system nope", "fault bogus", "kill point x, 0.01", "phase late", "repeats 0", "queue-ahead some"):
        assert part in msg, (part, msg)
