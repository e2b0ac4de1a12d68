"""Benchmark of ``dask_research.experiments``: memory per experiment.

Over 1,000 branches (instant runner, 3 slots, with a journal): what the trace and results hold
after a run, and the peak and held memory of a resume (``tracemalloc``), with the bounded trace
(``trace_scores=32``, the default) and with every score kept (``trace_scores="all"``),
extrapolated to 100,000 experiments (``--memory-experiments N``, default 20,000; 3,000 with
``--quick``).

Needs nothing beyond the package. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_memory.py [--quick]

Figure ``memory`` in ``benchmarks/results/bench_experiments_memory.json`` (and in
``bench_experiments.json`` when ``bench_experiments.py`` runs every section).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.experiment_workloads import hypotheses, instant  # noqa: E402
from benchmarks.harness import print_table, write_results  # noqa: E402
from dask_research.experiments import IterationScheduler  # noqa: E402

NOTES = "tracemalloc figures; MiB at 100k are extrapolated linearly"


def trace_memory(n: int, tmp: pathlib.Path, branches: int = 1_000) -> dict:
    """Bytes per experiment held by a run's trace and results, and by a resume."""
    import gc
    import tracemalloc

    out: dict = {}
    for mode in (32, "all"):
        path = tmp / f"mem-{mode}.jsonl"
        sched = IterationScheduler(instant, slots=3, progress=False, prune_floor=0.0,
                                   paper_threshold=1.0, trace_scores=mode, checkpoint=path)
        sched.add(hypotheses(n, branches))
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        report = sched.run()
        run_held = tracemalloc.get_traced_memory()[0] - base
        del report, sched
        gc.collect()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        again = IterationScheduler.resume(path, instant, progress=False)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del again
        out[f"trace_scores={mode}"] = {
            "run_bytes_per_experiment": run_held / n,
            "resume_peak_bytes_per_experiment": (peak - base) / n,
            "resume_held_bytes_per_experiment": (held - base) / n,
            "journal_bytes_per_experiment": path.stat().st_size / n,
            "run_MiB_at_100k": run_held / n * 1e5 / 2 ** 20,
            "resume_peak_MiB_at_100k": (peak - base) / n * 1e5 / 2 ** 20,
        }
        path.unlink()
    out["setup"] = {"experiments": n, "branches": branches, "runner": "instant", "slots": 3,
                    "measured_with": "tracemalloc (Python and numpy allocations)"}
    return out


def _print_memory(mem: dict) -> None:
    print_table([(k, f"{v['run_bytes_per_experiment']:,.0f}",
                  f"{v['resume_peak_bytes_per_experiment']:,.0f}",
                  f"{v['resume_held_bytes_per_experiment']:,.0f}",
                  f"{v['journal_bytes_per_experiment']:,.0f}",
                  f"{v['run_MiB_at_100k']:,.0f} / {v['resume_peak_MiB_at_100k']:,.0f}")
                 for k, v in mem.items() if k != "setup"],
                ("trace", "run B/exp", "resume peak B/exp", "resume held B/exp",
                 "journal B/exp", "MiB at 100k: run / resume"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--memory-experiments N`` (default 20,000; 3,000 with ``--quick``)."""
    ap.add_argument("--memory-experiments", type=int, default=None,
                    help="experiments of the memory section (default 20,000; 3,000 with --quick)")


def measure(args: argparse.Namespace) -> dict:
    """Section 6 of ``bench_experiments``: figure ``memory``."""
    n_mem = args.memory_experiments or (3_000 if args.quick else 20_000)
    print(f"\n6. memory per experiment, {n_mem:,} experiments over 1,000 branches")
    with tempfile.TemporaryDirectory() as tmp:
        mem = trace_memory(n_mem, pathlib.Path(tmp))
    _print_memory(mem)
    return {"memory": mem}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer experiments")
    add_arguments(ap)
    path = write_results("bench_experiments_memory", measure(ap.parse_args(argv)), notes=NOTES)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
