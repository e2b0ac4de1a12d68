"""Does Dask's statistical worker profiler cost the Monte-Carlo benchmark job anything?

Interleaved A/B on the embedded cluster (exactly what ``mc.run(job)`` starts, a fresh one per
run): (A) the profiler as the embedded cluster configures it today (``research.cluster.
distributed.worker.profile.interval: 100ms``), (B) the profiler off
(``distributed.worker.profile.enabled: false``, set through the same mapping). The job is the
benchmark's saturating 7-input pipeline, 640 x 65,536 draws, ``verify=0``. Per run: the run's
own wall time (cluster start and pilot excluded), the CPU seconds of this process for the call
(the workers are threads of it, so the profiler's work is in there; CPU time is far less
disturbed than wall time on a shared machine), the seconds the workers spent taking profile
samples (Dask's own ``profile-duration`` digest) and the machine's load.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_profiler.py [--pairs 5] [--shards 640]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import dask  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.bench_montecarlo import make_job  # noqa: E402
from benchmarks.harness import LoadMonitor, write_results  # noqa: E402
from dask_research import montecarlo as mc  # noqa: E402
from dask_research._cluster import embedded_cluster  # noqa: E402

ARMS = {"profiler 100ms (today)": {}, "profiler off": {"worker": {"profile": {"enabled": False}}}}


def one_run(job, extra: dict) -> tuple[float, float, float, float]:
    base = dask.config.get("research.cluster.distributed") or {}
    merged = dask.config.merge(base, extra)
    with dask.config.set({"research.cluster.distributed": merged}), embedded_cluster() as client, \
            LoadMonitor() as load:
        c0 = time.process_time()
        res = mc.run(job, client=client, verify=0, progress=False)
        cpu = time.process_time() - c0
        # Seconds the workers spent taking profile samples (Dask's own "profile-duration" digest).
        sampling = sum(client.run(lambda dask_worker: dask_worker.digests_total.get("profile-duration", 0.0)).values())
    return res.wall_seconds, cpu, load.machine_busy, sampling


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--shards", type=int, default=640)
    args = ap.parse_args(argv)
    job = make_job(args.shards, 65_536)
    mc.run(make_job(8, 65_536), verify=0, progress=False)          # warm-up: imports, first cluster
    walls: dict[str, list[float]] = {k: [] for k in ARMS}
    cpus: dict[str, list[float]] = {k: [] for k in ARMS}
    busy: dict[str, list[float]] = {k: [] for k in ARMS}
    sampling: dict[str, list[float]] = {k: [] for k in ARMS}
    for i in range(args.pairs):
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))  # ABBA: no arm always goes first
        for arm in order:
            wall, cpu, load, sampled = one_run(job, ARMS[arm])
            sampling[arm].append(sampled)
            walls[arm].append(wall)
            cpus[arm].append(cpu)
            busy[arm].append(load)
            print(f"pair {i} {arm:24s} {wall:6.2f} s  {job.total_samples / wall / 1e6:6.2f} M samples/s  "
                  f"cpu {cpu:6.2f} s  sampling {sampled * 1e3:6.1f} ms  machine busy {load:.2f}", flush=True)
    a, b = walls["profiler 100ms (today)"], walls["profiler off"]
    ratios = [x / y for x, y in zip(a, b)]
    ca, cb = cpus["profiler 100ms (today)"], cpus["profiler off"]
    cpu_ratios = [x / y for x, y in zip(ca, cb)]
    figures = {"samples": job.total_samples, "walls_s": walls, "cpu_s": cpus, "machine_busy": busy,
               "profile_sampling_s": sampling,
               "median_s": {k: statistics.median(v) for k, v in walls.items()},
               "median_cpu_s": {k: statistics.median(v) for k, v in cpus.items()},
               "pair_ratio_on_over_off": ratios, "median_ratio": statistics.median(ratios),
               "pair_cpu_ratio_on_over_off": cpu_ratios, "median_cpu_ratio": statistics.median(cpu_ratios)}
    print(f"median wall: on {statistics.median(a):.2f} s, off {statistics.median(b):.2f} s; "
          f"per-pair on/off {min(ratios):.3f}-{max(ratios):.3f}, median {statistics.median(ratios):.3f}")
    print(f"median cpu: on {statistics.median(ca):.2f} s, off {statistics.median(cb):.2f} s; "
          f"per-pair on/off {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}, median {statistics.median(cpu_ratios):.3f}")
    write_results("bench_profiler", figures, notes="interleaved ABBA pairs, fresh embedded cluster per run")
    return figures


if __name__ == "__main__":
    main()
