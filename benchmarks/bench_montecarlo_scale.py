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

``--wake`` measures instead what waking the driver costs the client per future, three ways:
one ``distributed.as_completed`` iterated on the client's loop (what the engine uses), a
coroutine per future awaiting Dask's ``_wait`` (what it used before), and
``Future.add_done_callback`` (a callback thread that wakes the loop).

``--count`` counts, per block, what the client asks of Dask during a run (graph messages,
gathers, RPC round trips, hops onto the client's loop, key-in-memory reports): figures that do
not move with the machine's load, unlike CPU time on a shared machine (needs ``yappi``).

``--groups 1,16`` measures each case with those ``research.montecarlo.group-blocks`` values
side by side in one process (1: a message per block, the path before groups; the window caps a
group at half of it, so pass ``--window 32`` for groups of 16 on a 2-thread worker); ``--pin``
puts the client on one CPU and the scheduler and worker on the others.

    python benchmarks/bench_montecarlo_scale.py [--quick] [--pin] [--groups 1,16] [--window N] [--wake] [--count]
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
def cluster(workers: int = 1, threads: int = 2, pin: bool = False):
    """A ``dask scheduler`` and ``workers`` ``dask worker`` subprocesses; yields (client, scheduler pid).

    ``pin``: the client on the first CPU, the scheduler and workers on the others (Linux), so
    the client's CPU time is not inflated by sharing its core with the workers.
    """
    from distributed import Client

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = pin and len(cpus) > 1
    if pin:
        os.sched_setaffinity(0, {cpus[0]})

    def rest() -> None:
        if pin:
            os.sched_setaffinity(0, set(cpus[1:]))

    tmp = tempfile.mkdtemp(prefix="bench-scale-")
    sfile = os.path.join(tmp, "scheduler.json")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                               "--no-dashboard", "--scheduler-file", sfile,
                               # the events handler, as on a documented deployment (docs/events.rst)
                               "--preload", "dask_research.events"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=rest)]
    try:
        for _ in range(workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                           sfile, "--nthreads", str(threads), "--no-dashboard"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=rest))
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


#: The run's checks off (``--defaults`` leaves them as a user gets them: verification of k shards,
#: speculation near the end, the merger's property check).
CHECKS_OFF = {"verify": 0, "check_merger": False, "speculate": 0.0}
CHECKS: dict = dict(CHECKS_OFF)


def one_run(client, sched_pid: int, shards: int, spt: int, store: str | None, writes: str, seed: int,
            groups: int = 16, window: int | None = None) -> dict:
    import dask
    import psutil

    from dask_research import montecarlo as mc

    job = mc.Job(ident, {"a": mc.Normal(0.0, 1.0)}, shards=shards, samples_per_shard=256, seed=seed,
                 range=(-8.0, 8.0), bins=256, name="scale")
    p = mc.pilot(job)
    sched = psutil.Process(sched_pid)
    with dask.config.set({"research.montecarlo.store-writes": writes, "research.montecarlo.group-blocks": groups}):
        s0, c0, w0 = sum(sched.cpu_times()[:2]), time.process_time(), time.perf_counter()
        res = mc.run(job, client=client, store=store, shards_per_task=spt, progress=False, pilot=p,
                     window=window, **CHECKS)
        c1, w1, s1 = time.process_time(), time.perf_counter(), sum(sched.cpu_times()[:2])
    mode = None
    if store is not None:
        rec = mc.RunStore(store).read_result(job.id) or {}
        mode = (rec.get("store_writes") or {}).get("mode", "client (before issue 20)")
    assert res.computed_shards == shards
    return {"client_cpu": c1 - c0, "scheduler_cpu": s1 - s0, "wall": w1 - w0, "mode": mode}


def measure(client, sched_pid, spt: int, store: bool, writes: str, base: int, repeat: int, seed: int,
            groups: int = 16, window: int | None = None) -> dict:
    runs: dict[int, list] = {base: [], 2 * base: []}
    for r in range(repeat):                    # N and 2N interleaved: a slow minute hits both
        for n in (base, 2 * base):
            d = tempfile.mkdtemp(prefix="bench-scale-store-") if store else None
            runs[n].append(one_run(client, sched_pid, n, spt, d, writes, seed + 1000 * r + n, groups, window))
    med = {n: {k: statistics.median(g[k] for g in got) for k in ("client_cpu", "scheduler_cpu", "wall")}
           for n, got in runs.items()}
    per_shard = max(0.0, (med[2 * base]["client_cpu"] - med[base]["client_cpu"]) / base)
    sched_per_shard = max(0.0, (med[2 * base]["scheduler_cpu"] - med[base]["scheduler_cpu"]) / base)
    net = net_per_block(med[base], med[2 * base], base // spt, IDLE)
    return {"client_us_per_block_net": net["client"] * 1e6, "scheduler_us_per_task_net": net["scheduler"] * 1e6,
            "shards_per_task": spt, "store": store, "store_writes": writes, "group_blocks": groups, "window": window,
            "mode": runs[2 * base][0]["mode"], "shards": [base, 2 * base], "runs": med,
            "client_us_per_shard": per_shard * 1e6, "client_us_per_block": per_shard * spt * 1e6,
            "client_us_per_shard_total": med[2 * base]["client_cpu"] / (2 * base) * 1e6,
            "scheduler_us_per_task": sched_per_shard * spt * 1e6}


#: CPU share of a core the connected client and the scheduler use while nothing runs (measured first).
IDLE = {"client": 0.0, "scheduler": 0.0}


def measure_idle(client, sched_pid: int, seconds: float = 5.0) -> dict:
    """Seconds of CPU per second the client process and the scheduler spend doing nothing."""
    import psutil

    sched = psutil.Process(sched_pid)
    s0, c0, w0 = sum(sched.cpu_times()[:2]), time.process_time(), time.perf_counter()
    time.sleep(seconds)
    w = time.perf_counter() - w0
    return {"client": (time.process_time() - c0) / w, "scheduler": (sum(sched.cpu_times()[:2]) - s0) / w}


def net_per_block(small: dict, large: dict, blocks: int, idle: dict) -> dict:
    """Marginal CPU per block, less what the idle client/scheduler spend over the extra wall time.

    The larger run lasts longer, and a connected client and a scheduler spend CPU per second
    (event-loop ticks, heartbeats) whatever the run does: that is not a per-block cost.
    """
    dwall = large["wall"] - small["wall"]
    return {k: max(0.0, (large[f"{k}_cpu"] - small[f"{k}_cpu"] - idle[k] * dwall) / blocks)
            for k in ("client", "scheduler")}


def model(per_block_us: float, sched_per_task_us: float, spt: int, shard_seconds: float = SEED_SHARD_SECONDS) -> dict:
    """Cores one client (and one scheduler) keep busy: the work per block over the CPU per block."""
    block_seconds = spt * shard_seconds
    client = block_seconds / (per_block_us * 1e-6) if per_block_us > 0 else float("inf")
    sched = block_seconds / (sched_per_task_us * 1e-6) if sched_per_task_us > 0 else float("inf")
    return {"shards_per_task": spt, "shard_seconds": shard_seconds, "block_seconds": block_seconds,
            "client_cores": client, "scheduler_cores": sched, "cores": min(client, sched)}


def noop(x):
    """A task that does nothing."""
    return x


def wake_cost(client, mode: str, n: int) -> float:
    """Client CPU (us) per future to submit ``n`` no-op tasks and wake a coroutine on each end."""
    import asyncio

    from distributed import as_completed

    from dask_research._compat import wait_futures

    loop = client.loop
    c0 = time.process_time()
    futs = [client.submit(noop, i, pure=False) for i in range(n)]

    async def drain() -> None:
        if mode == "as_completed":
            ended = as_completed(futs, loop=loop)
            for _ in range(n):
                await anext(ended)
            return
        done, left = asyncio.Event(), [n]

        def tick() -> None:
            left[0] -= 1
            if not left[0]:
                done.set()

        if mode == "_wait coroutine":
            async def track(f) -> None:
                try:
                    await wait_futures([f])
                except BaseException:
                    pass
                tick()

            for f in futs:
                loop.add_callback(track, f)
        else:                                   # add_done_callback: runs on Dask's callback thread
            running = asyncio.get_running_loop()
            for f in futs:
                f.add_done_callback(lambda _f: running.call_soon_threadsafe(tick))
        await done.wait()

    client.sync(drain)
    return (time.process_time() - c0) / n * 1e6


def wake_main(quick: bool) -> None:
    modes = ["as_completed", "_wait coroutine", "add_done_callback"]
    n, rounds = (500, 2) if quick else (1000, 4)
    got: dict[str, list[float]] = {m: [] for m in modes}
    with cluster() as (client, _):
        wake_cost(client, "as_completed", n)      # warm-up
        for r in range(rounds):
            for m in (modes if r % 2 == 0 else modes[::-1]):
                got[m].append(wake_cost(client, m, n))
    rows = [(m, f"{statistics.median(v):.0f}", f"{min(v):.0f}-{max(v):.0f}") for m, v in got.items()]
    print_table(rows, ("wake", "client us/future (median)", "range"))
    write_results("bench_montecarlo_wake", {"us_per_future": got, "futures": n, "rounds": rounds},
                  notes="submit included (the same for all); interleaved rounds; one dask worker subprocess")


#: What --count counts: yappi function name -> what it is.
COUNTED = {"Client._graph_to_futures": "graph messages", "Client._gather": "gathers", "send_recv": "rpc round trips",
           "Client._handle_key_in_memory": "key-in-memory reports", "Execution._collect": "driver turns"}


def count_main(spts: list[int], quick: bool) -> None:
    import tempfile

    try:
        import yappi
    except ImportError:
        raise SystemExit("--count needs yappi (pip install yappi)") from None
    from dask_research import montecarlo as mc

    shards = 4096 if quick else 16384
    rows, figures = [], []
    with cluster() as (client, _):
        for spt in spts:
            for store in (False, True):
                job = mc.Job(ident, {"a": mc.Normal(0.0, 1.0)}, shards=shards, samples_per_shard=256,
                             seed=7 + spt + store, range=(-8.0, 8.0), bins=256, name="scale")
                p = mc.pilot(job)
                yappi.clear_stats()
                yappi.set_clock_type("cpu")
                yappi.start(builtins=False)
                mc.run(job, client=client, store=tempfile.mkdtemp(prefix="bench-scale-store-") if store else None, verify=0,
                       shards_per_task=spt, progress=False, check_merger=False, pilot=p, speculate=0.0)
                yappi.stop()
                got = dict.fromkeys(COUNTED.values(), 0)
                for f in yappi.get_func_stats():
                    what = COUNTED.get(f.name) or COUNTED.get(f.full_name.rsplit(" ", 1)[-1])
                    if what:
                        got[what] += f.ncall
                blocks = shards // spt
                per = {k: v / blocks for k, v in got.items()}
                figures.append({"shards_per_task": spt, "store": store, "blocks": blocks, "per_block": per})
                rows.append((spt, "yes" if store else "no", blocks, *(f"{v:.2f}" for v in per.values())))
    print_table(rows, ("spt", "store", "blocks", *COUNTED.values()))
    write_results("bench_montecarlo_counts", {"runs": figures}, notes="per block: yappi call counts in the client "
                  "process during one run (workers and scheduler are subprocesses)")


HEADER = ("spt", "groups", "store", "writes", "mode", "us/shard", "us/block", "us/shard(total)", "sched us/task",
          "net us/block", "net us/shard", "net sched us/task")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller runs, one repeat")
    ap.add_argument("--label", default="", help="a tag for this measurement (e.g. before / after)")
    ap.add_argument("--spt", default="1,16,256", help="shards per task to measure (comma-separated powers of two)")
    ap.add_argument("--wake", action="store_true", help="measure the ways to wake the driver per future instead")
    ap.add_argument("--count", action="store_true", help="count the client's Dask operations per block instead")
    ap.add_argument("--groups", default="1,16", help="research.montecarlo.group-blocks values to measure side by side "
                    "(1: every block its own message, the path before groups)")
    ap.add_argument("--window", type=int, default=None, help="blocks in flight (default: 8 per thread, 16 here)")
    ap.add_argument("--writes", default="none,client,auto", help="store cases: none (no store), client, auto")
    ap.add_argument("--pin", action="store_true", help="the client on one CPU, scheduler and worker on the other")
    ap.add_argument("--defaults", action="store_true", help="verification, speculation and the merger check as a "
                    "user gets them (default: off, the client's bare cost)")
    args = ap.parse_args()
    if args.defaults:
        CHECKS.clear()
    if args.wake:
        wake_main(args.quick)
        return
    if args.count:
        count_main([int(x) for x in args.spt.split(",")], args.quick)
        return
    repeat = 1 if args.quick else 3
    spts = [int(x) for x in args.spt.split(",")]
    bases = {1: 256, 16: 2048, 256: 32768, 1024: 65536} if not args.quick else {1: 128, 16: 1024, 256: 8192,
                                                                                 1024: 16384}
    cases = {"none": (False, "auto"), "client": (True, "client"), "auto": (True, "auto")}
    groups = [int(g) for g in args.groups.split(",")]
    rows, figures = [], []
    with cluster(pin=args.pin) as (client, sched_pid):
        IDLE.update(measure_idle(client, sched_pid))
        print(f"idle: client {IDLE['client']:.1%} of a core, scheduler {IDLE['scheduler']:.1%}")
        seed = 1
        for spt in spts:
            for store, writes in (cases[w] for w in args.writes.split(",")):
                for g in groups:
                    seed += 1
                    # N and 2N must both form groups (a run of fewer than 4 windows of blocks forms
                    # none, see montecarlo/submission.py): else the marginal compares two paths.
                    base = max(bases.get(spt, 32 * spt), 4 * (args.window or 16) * spt)
                    f = measure(client, sched_pid, spt, store, writes, base, repeat, seed * 100_000, g, args.window)
                    figures.append(f)
                    rows.append((spt, g, "yes" if store else "no", writes if store else "-", f["mode"] or "-",
                                 f"{f['client_us_per_shard']:.1f}", f"{f['client_us_per_block']:.0f}",
                                 f"{f['client_us_per_shard_total']:.1f}", f"{f['scheduler_us_per_task']:.0f}",
                                 f"{f['client_us_per_block_net']:.0f}", f"{f['client_us_per_block_net'] / spt:.1f}",
                                 f"{f['scheduler_us_per_task_net']:.0f}"))
                    print_table(rows[-1:], HEADER)
    print()
    print_table(rows, HEADER)
    models = []
    for f in figures:
        if f["shards_per_task"] >= 256:
            m = model(f["client_us_per_block_net"], f["scheduler_us_per_task_net"], f["shards_per_task"])
            m["client_idle_share"], m["scheduler_idle_share"] = IDLE["client"], IDLE["scheduler"]
            m["client_cores"] *= 1 - IDLE["client"]          # the idle share is not available to blocks
            m["scheduler_cores"] *= 1 - IDLE["scheduler"]
            m["cores"] = min(m["client_cores"], m["scheduler_cores"])
            m.update(store=f["store"], store_writes=f["store_writes"], mode=f["mode"], group_blocks=f["group_blocks"])
            models.append(m)
    print()
    print_table([(m["shards_per_task"], m["group_blocks"], m["store"], m["store_writes"], m["mode"],
                  f"{m['client_cores']:,.0f}", f"{m['scheduler_cores']:,.0f}") for m in models],
                ("spt", "groups", "store", "writes", "mode", "cores/client", "cores/scheduler"))
    name = "bench_montecarlo_scale"
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    import json

    try:
        prev = json.loads(out.read_text())["figures"]
    except (OSError, ValueError, KeyError):
        prev = {}
    label = args.label or "latest"
    prev[label] = {"blocks": figures, "model_256": models, "quick": args.quick, "idle": dict(IDLE), "pin": args.pin,
                   "window": args.window, "checks": "defaults" if args.defaults else CHECKS_OFF}
    write_results(name, prev, notes="client CPU per shard is the marginal cost between N and 2N shards; net: less the "
                  "idle client's CPU over the extra wall time; workers and scheduler are subprocesses; model: "
                  "cores = (1 - idle share) x B x 7.5 ms / net client CPU per block")


if __name__ == "__main__":
    main()
