"""Benchmark of ``dask_research.experiments``: what ``apply_order="dispatch"`` and the journal cost.

``apply_order="dispatch"``: occupancy and the delay before a result is counted, real asyncio
runs with random durations (3 slots, exponential, mean 5 ms), against the default completion
order. The checkpoint journal: loop time per experiment, bytes per experiment, time to resume.

Needs nothing beyond the package. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_costs.py [--quick]

Figures ``apply_order`` and ``checkpoint`` in ``benchmarks/results/bench_experiments.json``.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.experiment_workloads import hypotheses, instant, median_of  # noqa: E402
from benchmarks.harness import print_table, run_section  # noqa: E402
from dask_research.experiments import Hypothesis, IterationScheduler  # noqa: E402


def _random_runner(seed: int, mean_ms: float):
    import asyncio

    rng = np.random.default_rng(seed)
    rewards = np.random.default_rng(seed + 1).beta(2, 5, 20)

    async def runner(h: Hypothesis) -> float:
        await asyncio.sleep(float(rng.exponential(mean_ms / 1000)))
        return float(rewards[int(h.branch[1:])])

    return runner


def apply_order_cost(n: int, reps: int, mean_ms: float = 5.0) -> dict:
    out = {}
    for order in ("completion", "dispatch"):
        rows = []
        for rep in range(reps):
            sched = IterationScheduler(_random_runner(rep, mean_ms), slots=3, progress=False,
                                       prune_floor=0.0, apply_order=order)
            sched.add(hypotheses(n, 20))
            report = sched.run()
            lat = []
            done = {e.hypothesis: e.t for e in report.events.of("finish")}
            for e in report.events.of("result"):
                if e.hypothesis in done:
                    lat.append(e.t - done[e.hypothesis])
            rows.append({"occupancy": report.occupancy,
                         "wall_s": report.wall_seconds,
                         "apply_latency_ms_mean": 1e3 * statistics.mean(lat) if lat else 0.0,
                         "apply_latency_ms_p90": 1e3 * sorted(lat)[int(0.9 * len(lat))]
                         if lat else 0.0})
        out[order] = median_of(rows)
    out["setup"] = {"experiments": n, "slots": 3, "durations_ms": f"exponential, mean {mean_ms}"}
    return out


def checkpoint_cost(n: int, tmp: pathlib.Path) -> dict:
    out = {}
    for label, path in (("no checkpoint", None), ("checkpoint (local journal)",
                                                  tmp / "bench-loop.jsonl")):
        if path is not None and path.exists():
            path.unlink()
        sched = IterationScheduler(instant, slots=3, progress=False, prune_floor=0.0,
                                   checkpoint=path)
        sched.add(hypotheses(n, 100))
        report = sched.run()
        out[label] = {"loop_us_per_experiment": 1e6 * report.wall_seconds / report.dispatched}
        if path is not None:
            out[label]["journal_bytes_per_experiment"] = path.stat().st_size / n
            t0 = time.perf_counter()
            IterationScheduler.resume(path, instant, progress=False)
            out[label]["resume_seconds"] = time.perf_counter() - t0
            path.unlink()
    out["setup"] = {"experiments": n, "branches": 100, "runner": "instant"}
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """This section has no options of its own (``--quick``: fewer experiments, one rep)."""


def measure(args: argparse.Namespace) -> dict:
    """Section 5 of ``bench_experiments``: figures ``apply_order`` and ``checkpoint``."""
    reps = 1 if args.quick else 3
    print("\n5. cost of apply_order='dispatch' (3 slots, exponential durations, mean 5 ms) "
          "and of the checkpoint journal")
    figures: dict = {}
    figures["apply_order"] = ao = apply_order_cost(150 if args.quick else 600, reps)
    print_table([(order, f"{100 * ao[order]['occupancy']:.1f} %",
                  f"{ao[order]['apply_latency_ms_mean']:.2f}",
                  f"{ao[order]['apply_latency_ms_p90']:.2f}", f"{ao[order]['wall_s']:.2f}")
                 for order in ("completion", "dispatch")],
                ("apply order", "occupancy", "apply latency ms (mean)", "p90", "wall s"))
    with tempfile.TemporaryDirectory() as tmp:
        figures["checkpoint"] = ck = checkpoint_cost(2_000 if args.quick else 10_000,
                                                     pathlib.Path(tmp))
    print_table([(k, f"{v['loop_us_per_experiment']:.1f}",
                  f"{v.get('journal_bytes_per_experiment', 0):.0f}",
                  f"{v.get('resume_seconds', 0):.2f}")
                 for k, v in ck.items() if k != "setup"],
                ("checkpoint", "loop us / experiment", "journal bytes / exp",
                 "resume s"))
    return figures


def main(argv: list[str] | None = None) -> None:
    run_section("bench_experiments", __doc__.splitlines()[0], add_arguments, measure, argv=argv)


if __name__ == "__main__":
    main()
