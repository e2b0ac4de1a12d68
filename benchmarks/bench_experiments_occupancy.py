"""Benchmark of ``dask_research.experiments``: slot occupancy while work is queued.

Goal >= 99 %, with the deterministic runner at 5 ms and 3 slots: without a client (asyncio
tasks) and with Dask futures (LocalCluster, processes=False). Next to it the *runner share*:
the fraction of busy slot-time spent inside the runner; the rest is transport (the hand-off,
Dask's ``client.submit``, measured separately, and the Dask round trip), which the occupancy
counts as busy: a slot is busy from its dispatch event, stamped as the hand-off begins, to its
result event.

Needs nothing beyond the package. Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_occupancy.py [--quick]

Figure ``occupancy`` in ``benchmarks/results/bench_experiments.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.experiment_workloads import N_BRANCHES, hypotheses, median_of, refill_gaps  # noqa: E402
from benchmarks.harness import print_table, run_section  # noqa: E402
from dask_research.experiments import IterationScheduler, make_deterministic_runner  # noqa: E402

NOTES = ("occupancy = busy slot-time / available slot-time over the periods in which work "
         "was queued, from the scheduler's own trace (a slot is busy from its dispatch "
         "event, stamped as the hand-off to the backend begins, to its result event); "
         "runner_share = time inside the runner / busy slot-time (the rest is transport: "
         "the hand-off and the Dask round trip).")


def _occupancy_figures(report) -> dict:
    busy = sum(iv.end - iv.start for iv in report.events.intervals())
    inside = sum(r.duration for r in report.results)
    gaps = sorted(refill_gaps(report))
    return {"occupancy": report.occupancy, "runner_share": inside / busy,
            "max_concurrency": report.events.max_concurrency(),
            "refill_gap_us_median": 1e6 * gaps[len(gaps) // 2],
            "wall_s": report.wall_seconds, "experiments": report.total_runs}


def _occupancy_scheduler(client, n: int, branches: int, delay_ms: float = 5) -> IterationScheduler:
    rewards = {f"b{k}": 0.3 + 0.6 * k / max(branches - 1, 1) for k in range(branches)}
    sched = IterationScheduler(make_deterministic_runner(rewards, delay_ms=delay_ms), slots=3,
                               client=client, progress=False, prune_floor=0.0,
                               transport="tasks" if client is not None else None)   # Dask futures
    sched.add(hypotheses(n, branches))
    return sched


def occupancy(n: int, reps: int, branches: int) -> dict:
    from distributed import Client, LocalCluster

    out = {}
    runs = [_occupancy_figures(_occupancy_scheduler(None, n, branches).run())
            for _ in range(reps)]
    out["asyncio"] = median_of(runs)
    runs = [_occupancy_figures(_occupancy_scheduler(None, n, N_BRANCHES).run())
            for _ in range(reps)]
    out["asyncio, 1,000 branches"] = median_of(runs)
    runs = [_occupancy_figures(_occupancy_scheduler(None, n // 4, branches, delay_ms=50).run())]
    out["asyncio, runner 50 ms (context)"] = median_of(runs)
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        _occupancy_scheduler(client, 30, branches).run()         # untimed warm-up
        with _timed_handoff() as handoff:
            runs = [_occupancy_figures(_occupancy_scheduler(client, n, branches).run())
                    for _ in range(reps)]
        out["dask_futures"] = median_of(runs)
        out["dask_futures"]["handoff_us_median"] = 1e6 * statistics.median(handoff)
        t0 = time.perf_counter()
        client.gather(client.map(lambda x: x, range(500), pure=False))
        out["dask_futures"]["noop_task_ms"] = 1e3 * (time.perf_counter() - t0) / 500
    return out


@contextlib.contextmanager
def _timed_handoff():
    """Seconds each ``DaskBackend.submit`` (Dask's ``client.submit``) takes: the hand-off,
    which the trace counts as busy slot-time (the dispatch event is stamped as it begins)."""
    from dask_research.experiments import backends

    real, spent = backends.DaskBackend.submit, []

    def submit(self, h):
        t0 = time.perf_counter()
        try:
            return real(self, h)
        finally:
            spent.append(time.perf_counter() - t0)

    backends.DaskBackend.submit = submit
    try:
        yield spent
    finally:
        backends.DaskBackend.submit = real


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """This section has no options of its own (``--quick``: 150 experiments, one rep)."""


def measure(args: argparse.Namespace) -> dict:
    """Section 2 of ``bench_experiments``: figure ``occupancy``."""
    reps = 1 if args.quick else 3
    print("\n2. slot occupancy while work is queued, 3 slots, runner sleeps 5 ms")
    occ = occupancy(150 if args.quick else 600, reps, branches=20)
    print("(20 branches unless said; the Dask row: LocalCluster 1 worker x 3 threads, "
          "processes=False)")
    print_table([(mode, f"{100 * f['occupancy']:.2f} %", f"{100 * f['runner_share']:.1f} %",
                  f"{f['refill_gap_us_median']:.0f}", f["max_concurrency"],
                  f"{f['wall_s']:.2f}")
                 for mode, f in occ.items()],
                ("mode", "occupancy (goal >= 99 %)", "runner share", "refill us",
                 "max in flight", "wall s"))
    print(f"(Dask no-op task round trip on this machine: "
          f"{occ['dask_futures']['noop_task_ms']:.2f} ms; hand-off, client.submit: "
          f"{occ['dask_futures']['handoff_us_median']:.0f} us, counted as busy)")
    return {"occupancy": occ}


def main(argv: list[str] | None = None) -> None:
    run_section("bench_experiments", __doc__.splitlines()[0], add_arguments, measure,
                notes=NOTES, argv=argv)


if __name__ == "__main__":
    main()
