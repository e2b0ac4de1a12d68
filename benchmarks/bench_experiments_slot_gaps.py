"""Where a slot's time goes on a Dask cluster (issue 30): the start of a run, the gaps between
experiments, the end of a run, per transport and queue-ahead setting.

Run one benchmark at a time::

    flock /tmp/dask-research-bench.lock python benchmarks/bench_experiments_slot_gaps.py

A real ``dask scheduler`` and ``N`` one-thread ``dask worker`` processes
(:func:`dask_research.testing.processes.dask_processes`), ``N`` slots, ``--per-slot``
experiments per slot that sleep ``--delay`` seconds and return their own start and end times
(``time.time()`` on the worker; the workers share this machine's clock). For each transport
(``tasks``, and ``actors`` on a client made with ``direct_to_workers=True``) and each
``queue_ahead`` setting, ``--reps`` runs; per run:

- ``occupancy``: experiments x delay / (``N`` x the wall time of ``run()``), as in
  ``bench_experiments_dask_peers.py``;
- ``start_ms``: from ``run()`` being called to each worker's first experiment starting
  (min, max over the workers);
- ``end_ms``: from each worker's last experiment ending to ``run()`` returning (min, max);
- ``gaps_ms``: between consecutive experiments on a worker (sum over all workers, median,
  max): the time a slot idles between two experiments.

Every transport and setting runs once unmeasured first (imports on the workers).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, load_averages, print_table, write_results  # noqa: E402


def _runner(delay: float) -> Any:
    from dask_research.experiments import Result

    def runner(h: Any) -> Any:
        import os
        import time

        t0 = time.time()
        time.sleep(delay)
        return Result(h, 0.5, {"start": t0, "end": time.time(), "pid": os.getpid()})
    return runner


def one_run(client: Any, transport: str, queue_ahead: Any, n: int, delay: float, per_slot: int) -> dict:
    from dask_research.experiments import Hypothesis, IterationScheduler

    trials = per_slot * n
    sched = IterationScheduler(_runner(delay), slots=n, client=client, transport=transport,
                               queue_ahead=queue_ahead, max_experiments=trials, prune_floor=0.0,
                               progress=False)
    sched.add([Hypothesis(f"h{j}", f"b{j % 4}", {"x": 0}) for j in range(trials)])
    t0 = time.time()
    report = sched.run()
    t1 = time.time()
    by: dict[int, list[tuple[float, float]]] = {}
    for r in report.results:
        by.setdefault(r.metrics["pid"], []).append((r.metrics["start"], r.metrics["end"]))
    starts, ends, gaps = [], [], []
    for spans in by.values():
        spans.sort()
        starts.append(spans[0][0] - t0)
        ends.append(t1 - spans[-1][1])
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return {"occupancy": len(report.results) * delay / (n * (t1 - t0)),
            "start_ms": [1e3 * min(starts), 1e3 * max(starts)],
            "end_ms": [1e3 * min(ends), 1e3 * max(ends)],
            "gaps_ms": {"sum": 1e3 * sum(gaps), "median": 1e3 * statistics.median(gaps), "max": 1e3 * max(gaps)},
            "per_worker": sorted(len(v) for v in by.values())}


def main(argv: list[str] | None = None) -> dict:
    from distributed import Client

    from dask_research.testing.processes import dask_processes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--per-slot", type=int, default=10)
    ap.add_argument("--transports", default="tasks,actors")
    ap.add_argument("--queue-ahead", default="auto,1")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    settings = [q if q == "auto" else int(q) for q in args.queue_ahead.split(",")]
    n = args.slots
    figures: dict[str, Any] = {"slots": n, "delay_s": args.delay, "per_slot": args.per_slot, "runs": {},
                               "uptime": {"before": load_averages()}}
    rows = []
    with LoadMonitor() as load, tempfile.TemporaryDirectory() as where, \
            dask_processes(pathlib.Path(where), n_workers=n) as (client, _), \
            Client(client.scheduler.address, direct_to_workers=True, set_as_default=False, timeout=60) as direct:
        clients = {"tasks": client, "actors": direct}
        for transport in args.transports.split(","):
            for qa in settings:               # unmeasured: imports on the workers
                one_run(clients[transport], transport, qa, n, 0.005, 2)
        for rep in range(args.reps):
            for transport in args.transports.split(","):
                for qa in settings:
                    f = one_run(clients[transport], transport, qa, n, args.delay, args.per_slot)
                    figures["runs"][f"{transport}|{qa}|{rep}"] = f
                    rows.append((transport, qa, rep, f"{100 * f['occupancy']:.1f} %",
                                 "{:.0f}-{:.0f}".format(*f["start_ms"]), "{:.0f}-{:.0f}".format(*f["end_ms"]),
                                 f"{f['gaps_ms']['sum']:.0f}", f"{f['gaps_ms']['median']:.1f}",
                                 f"{f['gaps_ms']['max']:.0f}"))
                    print(*rows[-1], sep="  ", flush=True)
    figures["machine_busy"] = load.machine_busy
    figures["uptime"]["after"] = load_averages()
    print_table(rows, ("transport", "queue_ahead", "rep", "occupancy", "start ms", "end ms", "gaps sum ms",
                       "gap median ms", "gap max ms"))
    print(f"load: before {figures['uptime']['before']}; after {figures['uptime']['after']}")
    if not args.no_write:
        path = write_results("bench_experiments_slot_gaps", figures, notes=(
            "Real dask scheduler + N one-thread dask worker processes on this machine; sleeping "
            "experiments timed on the workers; start/end relative to run() in the driver"))
        print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
