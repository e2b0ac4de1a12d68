"""Monte-Carlo throughput with one worker on a slow, lossy link (issue 28).

Real ``dask scheduler`` / ``dask worker`` processes, one thread each, the demo's seven-input
pipeline (65,536 samples per shard), a store written by the workers, default verification and
speculation. Three clusters, measured in interleaved rounds in one process:

- **clean**: two workers on loopback;
- **slow link**: the same, with the second worker behind :mod:`dask_research.testing.latency`
  on both of its addresses: 100 ms each way (200 ms round trip), 5 % of chunks held back a
  retransmission timeout (this machine's kernel has no ``sch_netem`` for ``tc netem``);
- **one worker**: the first worker alone, what the run would get if the slow worker gave
  nothing.

The figure is shards per second and the ratio of each cluster to clean (same bits in all
three, checked). A ratio between "one worker" and 1.0 says how much of the slow worker's
compute the run still gets.

    python benchmarks/bench_montecarlo_latency.py [--quick] [--no-write]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import LoadMonitor, finish, print_table  # noqa: E402

ONE_WAY, LOSS = 0.1, 0.05


def _job(shards: int):
    from dask_research import montecarlo as mc
    from dask_research.demo import SEED, saturating

    names = "abcdefg"
    mus = [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0]
    sds = [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]
    return mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip(names, mus, sds)},
                  shards=shards, samples_per_shard=65_536, seed=SEED, name="saturating")


@contextlib.contextmanager
def _cluster(kind: str, where: pathlib.Path):
    from dask_research.testing.latency import slow_link_cluster
    from dask_research.testing.processes import process_cluster

    if kind == "slow link":
        with slow_link_cluster(where, ONE_WAY, LOSS) as (c, _):
            yield c.client
        return
    with process_cluster(where, 1 if kind == "one worker" else 2) as c:
        yield c.client


def measure(shards: int, rounds: int) -> dict:
    from dask_research import montecarlo as mc

    job = _job(shards)
    kinds = ["clean", "slow link", "one worker"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    states = {}
    for r in range(rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):          # interleaved, order alternating
            with tempfile.TemporaryDirectory() as d, _cluster(kind, pathlib.Path(d)) as client:
                t0 = time.perf_counter()
                res = mc.run(job, client=client, store=str(pathlib.Path(d) / "store"), progress=False)
                times[kind].append(time.perf_counter() - t0)
                states.setdefault(kind, res.state)
            print(f"  round {r + 1} {kind}: {times[kind][-1]:.2f} s", flush=True)
    same = all(s == states["clean"] for s in states.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"shards": shards, "samples_per_shard": 65_536, "rounds": rounds,
            "one_way_s": ONE_WAY, "loss": LOSS, "same_bits": same,
            "seconds": times, "median_seconds": med,
            "shards_per_second": {k: shards / v for k, v in med.items()},
            "ratio_to_clean": {k: med["clean"] / v for k, v in med.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 shards, one round")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--name", default="bench_montecarlo_latency")
    args = ap.parse_args()
    shards, rounds = (256, 1) if args.quick else (1024, 3)
    with LoadMonitor() as load:
        figures = measure(shards, rounds)
    print_table([(k, f"{figures['median_seconds'][k]:.2f}", f"{figures['shards_per_second'][k]:.0f}",
                  f"{figures['ratio_to_clean'][k]:.2f}") for k in figures["median_seconds"]],
                ("cluster", "median s", "shards/s", "x clean"))
    print(f"same bits on all three: {figures['same_bits']}; machine busy {100 * load.machine_busy:.0f} %")
    finish(args, figures, load)


if __name__ == "__main__":
    main()
