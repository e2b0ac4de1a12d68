"""Two objectives, a crash, a resume: Pareto UCB1 with a checkpoint journal.

Five model families (branches) trade accuracy against cost. The runner returns both as a
vector reward; Pareto UCB1 spends the slots on branches whose upper bounds are not dominated.
The first run is stopped after 25 experiments (as a crash would stop it); the second resumes
from the journal and finishes. The report lists the Pareto front of branches.

Run::

    python examples/experiments_pareto_resume.py
"""
from __future__ import annotations

import pathlib
import tempfile

import numpy as np

from dask_research.experiments import Hypothesis, IterationScheduler, Result

FAMILIES = {               # (accuracy, cost) around which each family's settings scatter
    "linear": (0.55, 0.05), "boosted-trees": (0.82, 0.35), "small-net": (0.74, 0.2),
    "large-net": (0.9, 0.8), "knn": (0.6, 0.5),
}


def runner(h: Hypothesis) -> Result:
    acc, cost = FAMILIES[h.branch]
    rng = np.random.default_rng(h.payload["seed"])             # deterministic per hypothesis
    acc = float(np.clip(acc + rng.normal(0, 0.05), 0, 1))
    cost = float(np.clip(cost + rng.normal(0, 0.05), 0, 1))
    return Result(h, {"accuracy": acc, "cost": cost}, {"seed": h.payload["seed"]})


def build(checkpoint: pathlib.Path, budget: int | None) -> IterationScheduler:
    sched = IterationScheduler(runner, slots=3, policy="pareto-ucb1", seed=1, progress=False,
                               objectives={"accuracy": "max", "cost": "min"},
                               prune_floor={"accuracy": 0.5}, prune_after_runs=3,
                               paper_threshold={"accuracy": 0.8, "cost": 0.4},
                               checkpoint=checkpoint, max_experiments=budget)
    sched.add([Hypothesis(f"{b}-{k}", b, {"seed": 100 * j + k})
               for k in range(12) for j, b in enumerate(FAMILIES)])
    return sched


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "loop.jsonl"
        first = build(path, budget=25).run()
        print(f"first run: {first.stop_reason} after {first.dispatched} experiments")
        report = IterationScheduler.resume(path, runner, max_experiments=None,
                                           progress=False).run()
        print(f"resumed: {report.replayed} outcomes restored, {report.dispatched} more run")
        print(report)
        print("front:", [row["branch"] for row in report.front_table()])


if __name__ == "__main__":
    main()
