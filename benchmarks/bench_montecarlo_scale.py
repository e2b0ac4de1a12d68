"""Monte-Carlo at cluster scale: what one client costs per shard and per block (issue 20).

The workers and the scheduler are real ``dask scheduler`` / ``dask worker`` subprocesses, so
the client process's CPU (``time.process_time()`` around ``mc.run``) is the client's own work:
submitting blocks, gathering results, folding the tree, writing the store (when the client
writes it), events. The scheduler's CPU is read from its process (psutil) and reported apart.

A near-free pipeline (``a -> a``) on small shards (256 samples) makes the client's cost
dominate. For each shards-per-task value (1, 16, 256), with and without a store, and with the
store written by the client (``research.montecarlo.store-writes: client``, today's path) and
by the block tasks (``auto``), the run is measured at two sizes N and 2N shards; the
*marginal* cost ``(cpu(2N) - cpu(N)) / N`` is the per-shard figure (a run's fixed costs, such
as its start and done events, cancel out), and per block is that times the block size.

Then a model: a client that spends ``c`` seconds of CPU per block of ``B`` shards keeps
``cores = B * t_shard / c`` cores busy when one shard takes ``t_shard`` seconds on one core
(7.5 ms at the seed's 65,536 samples per shard); the scheduler's own per-task CPU gives its
ceiling the same way. See docs/scaling.rst.

    python benchmarks/bench_montecarlo_scale.py [--quick]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import print_table, write_results  # noqa: E402

#: Seconds one shard of the seed's 65,536 samples takes on one core (docs/montecarlo.rst).
SEED_SHARD_SECONDS = 7.5e-3


def ident(a):
    """The near-free pipeline."""
    return a


@contextlib.contextmanager
def cluster(workers: int = 1, threads: int = 2):
    """A ``dask scheduler`` and ``workers`` ``dask worker`` subprocesses; yields (client, scheduler pid)."""
    from distributed import Client

    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    sfile = os.path.join(tmp, "scheduler.json")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                               "--no-dashboard", "--scheduler-file", sfile], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                           sfile, "--nthreads", str(threads), "--no-dashboard"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        t0 = time.monotonic()
        while not os.path.exists(sfile):
            if time.monotonic() - t0 > 60:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.1)
        with Client(scheduler_file=sfile, timeout=60) as c:
            c.wait_for_workers(workers, timeout=120)
            yield c, procs[0].pid
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def one_run(client, sched_pid: int, shards: int, spt: int, store: str | None, writes: str, seed: int) -> dict:
    import dask
    import psutil

    from dask_research import montecarlo as mc

    job = mc.Job(ident, {"a": mc.Normal(0.0, 1.0)}, shards=shards, samples_per_shard=256, seed=seed,
                 range=(-8.0, 8.0), bins=256, name="scale")
    p = mc.pilot(job)
    sched = psutil.Process(sched_pid)
    with dask.config.set({"research.montecarlo.store-writes": writes}):
        s0, c0, w0 = sum(sched.cpu_times()[:2]), time.process_time(), time.perf_counter()
        res = mc.run(job, client, store=store, verify=0, shards_per_task=spt, progress=False,
                     check_merger=False, pilot=p, speculate=0.0)
        c1, w1, s1 = time.process_time(), time.perf_counter(), sum(sched.cpu_times()[:2])
    mode = None
    if store is not None:
        rec = mc.RunStore(store).read_result(job.id) or {}
        mode = (rec.get("store_writes") or {}).get("mode", "client (before issue 20)")
    assert res.computed_shards == shards
    return {"client_cpu": c1 - c0, "scheduler_cpu": s1 - s0, "wall": w1 - w0, "mode": mode}


def measure(client, sched_pid, spt: int, store: bool, writes: str, base: int, repeat: int, seed: int) -> dict:
    runs = {}
    for n in (base, 2 * base):
        got = []
        for r in range(repeat):
            d = tempfile.mkdtemp(prefix="bench-scale-store-") if store else None
            got.append(one_run(client, sched_pid, n, spt, d, writes, seed + 1000 * r + n))
        runs[n] = got
    med = {n: {k: statistics.median(g[k] for g in got) for k in ("client_cpu", "scheduler_cpu", "wall")}
           for n, got in runs.items()}
    per_shard = max(0.0, (med[2 * base]["client_cpu"] - med[base]["client_cpu"]) / base)
    sched_per_shard = max(0.0, (med[2 * base]["scheduler_cpu"] - med[base]["scheduler_cpu"]) / base)
    return {"shards_per_task": spt, "store": store, "store_writes": writes,
            "mode": runs[2 * base][0]["mode"], "shards": [base, 2 * base], "runs": med,
            "client_us_per_shard": per_shard * 1e6, "client_us_per_block": per_shard * spt * 1e6,
            "client_us_per_shard_total": med[2 * base]["client_cpu"] / (2 * base) * 1e6,
            "scheduler_us_per_task": sched_per_shard * spt * 1e6}


def model(per_block_us: float, sched_per_task_us: float, spt: int, shard_seconds: float = SEED_SHARD_SECONDS) -> dict:
    """Cores one client (and one scheduler) keep busy: the work per block over the CPU per block."""
    block_seconds = spt * shard_seconds
    client = block_seconds / (per_block_us * 1e-6) if per_block_us > 0 else float("inf")
    sched = block_seconds / (sched_per_task_us * 1e-6) if sched_per_task_us > 0 else float("inf")
    return {"shards_per_task": spt, "shard_seconds": shard_seconds, "block_seconds": block_seconds,
            "client_cores": client, "scheduler_cores": sched, "cores": min(client, sched)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller runs, one repeat")
    ap.add_argument("--label", default="", help="a tag for this measurement (e.g. before / after)")
    args = ap.parse_args()
    repeat = 1 if args.quick else 3
    bases = {1: 256, 16: 2048, 256: 8192} if not args.quick else {1: 128, 16: 1024, 256: 4096}
    rows, figures = [], []
    with cluster() as (client, sched_pid):
        seed = 1
        for spt in (1, 16, 256):
            for store, writes in ((False, "auto"), (True, "client"), (True, "auto")):
                seed += 1
                f = measure(client, sched_pid, spt, store, writes, bases[spt], repeat, seed * 100_000)
                figures.append(f)
                rows.append((spt, "yes" if store else "no", writes if store else "-", f["mode"] or "-",
                             f"{f['client_us_per_shard']:.1f}", f"{f['client_us_per_block']:.0f}",
                             f"{f['client_us_per_shard_total']:.1f}", f"{f['scheduler_us_per_task']:.0f}"))
                print_table(rows[-1:], ("spt", "store", "writes", "mode", "us/shard", "us/block",
                                        "us/shard(total)", "sched us/task"))
    print()
    print_table(rows, ("spt", "store", "writes", "mode", "us/shard", "us/block", "us/shard(total)",
                       "sched us/task"))
    models = []
    for f in figures:
        if f["shards_per_task"] == 256:
            m = model(f["client_us_per_block"], f["scheduler_us_per_task"], 256)
            m.update(store=f["store"], store_writes=f["store_writes"], mode=f["mode"])
            models.append(m)
    print()
    print_table([(m["store"], m["store_writes"], m["mode"], f"{m['client_cores']:,.0f}",
                  f"{m['scheduler_cores']:,.0f}") for m in models],
                ("store", "writes", "mode", "cores/client", "cores/scheduler"))
    name = "bench_montecarlo_scale"
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    import json

    try:
        prev = json.loads(out.read_text())["figures"]
    except (OSError, ValueError, KeyError):
        prev = {}
    label = args.label or "latest"
    prev[label] = {"blocks": figures, "model_256": models, "quick": args.quick}
    write_results(name, prev, notes="client CPU per shard is the marginal cost between N and 2N shards; "
                  "workers and scheduler are subprocesses; model: cores = B x 7.5 ms / client CPU per block")


if __name__ == "__main__":
    main()
