"""Benchmark of ``dask_research.experiments``: the cost of one scheduling decision.

With 10,000 queued hypotheses over 1,000 branches (goal < 100 us): (a) the decision alone,
``BranchLedger.select`` + ``pop`` (UCB1 over every branch, vectorised) with results recorded as
they would arrive with 3 slots; (b) the live loop: the gap between a result and the refill of
its slot, read from the trace of a real run with an instant runner (the result's bookkeeping
and the decision), and the loop's wall time per experiment.

Needs nothing beyond the package. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_decision.py [--quick]

Figures ``decision_alone`` and ``decision_live`` in ``benchmarks/results/bench_experiments.json``
(``bench_experiments.py`` runs every section).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.experiment_workloads import N_BRANCHES, N_QUEUED, hypotheses, instant, refill_gaps  # noqa: E402
from benchmarks.harness import print_table, run_section  # noqa: E402
from dask_research.experiments import ExperimentResult as Result  # noqa: E402
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.ledger import BranchLedger  # noqa: E402


def decision_alone(decisions: int, reps: int) -> dict:
    hyps = hypotheses(N_QUEUED, N_BRANCHES)
    rng = np.random.default_rng(0)
    rewards = rng.random(decisions)
    per = []
    for _ in range(reps):
        led = BranchLedger(c=2 ** 0.5)
        led.add(hyps)
        inflight: list[Hypothesis] = []
        t0 = time.perf_counter()
        for k in range(decisions):
            i, _ = led.select()  # type: ignore[misc]
            inflight.append(led.pop(i))
            if len(inflight) == 3:           # 3 slots: a result frees one before each decision
                led.record(Result(inflight.pop(0), float(rewards[k])))
        per.append((time.perf_counter() - t0) / decisions)
        assert led.total_queued == N_QUEUED - decisions
    return {"us_per_decision": 1e6 * statistics.median(per),
            "reps_us": [round(1e6 * p, 2) for p in per],
            "queued_at_start": N_QUEUED, "queued_at_end": N_QUEUED - decisions,
            "branches": N_BRANCHES}


def decision_live(reps: int) -> dict:
    walls, medians, p99s = [], [], []
    for _ in range(reps):
        sched = IterationScheduler(instant, slots=3, progress=False, prune_floor=0.0)
        sched.add(hypotheses(N_QUEUED, N_BRANCHES))
        report = sched.run()
        assert report.total_runs == N_QUEUED
        gaps = sorted(refill_gaps(report))
        medians.append(gaps[len(gaps) // 2])
        p99s.append(gaps[int(0.99 * len(gaps))])
        walls.append(report.wall_seconds / report.dispatched)
    return {"refill_gap_us_median": 1e6 * statistics.median(medians),
            "refill_gap_us_p99": 1e6 * statistics.median(p99s),
            "loop_us_per_experiment": 1e6 * statistics.median(walls),
            "experiments": N_QUEUED, "branches": N_BRANCHES}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """This section has no options of its own (``--quick``: one rep)."""


def measure(args: argparse.Namespace) -> dict:
    """Section 1 of ``bench_experiments``: figures ``decision_alone`` and ``decision_live``."""
    reps = 1 if args.quick else 3
    print(f"1. decision overhead, {N_QUEUED:,} queued over {N_BRANCHES:,} branches")
    figures = {"decision_alone": decision_alone(2_000, reps),
               "decision_live": decision_live(1 if args.quick else 3)}
    d, live = figures["decision_alone"], figures["decision_live"]
    print_table([
        ("select + pop (UCB1 over 1,000 branches)", f"{d['us_per_decision']:.1f}", "< 100"),
        ("live loop: result -> refill, median", f"{live['refill_gap_us_median']:.1f}", "< 100"),
        ("live loop: result -> refill, p99", f"{live['refill_gap_us_p99']:.1f}", ""),
        ("live loop: wall per experiment (instant runner)",
         f"{live['loop_us_per_experiment']:.1f}", ""),
    ], ("figure", "us", "goal"))
    return figures


def main(argv: list[str] | None = None) -> None:
    run_section("bench_experiments", __doc__.splitlines()[0], add_arguments, measure, argv=argv)


if __name__ == "__main__":
    main()
