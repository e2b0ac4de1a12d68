"""GPU figures for issue 19: Philox on the device, Monte-Carlo throughput, replay on CUDA.

Parts (run one, or ``all``), each writing ``benchmarks/results/bench_gpu_<part>.json``:

``philox``
    the raw Philox4x64-10 stream of the CUDA kernel vs ``numpy.random.Philox`` on a few shards
    (bit for bit), and the kernel's rate in words/s.
``mc``
    the 7-input example (``examples/saturating_pipeline.py``: 640 shards x 65,536 draws) as a
    device job on the GPU, against the same draws (the portable algorithm, which is also what
    verification re-runs) on all CPU cores, and against the ordinary CPU job (numpy's C Philox +
    ziggurat), all in one run; every GPU shard is compared with its CPU twin in the tolerance
    class and the worst scaled difference per field is reported.
``replay``
    device-tier uniform sampling, ``batches(to="torch", device="cuda")`` exposed latency with
    prefetch 0 vs 2 for a learner step of about one sampling time, and TorchRL's
    ``LazyTensorStorage(device="cuda")`` sampling on the same machine, if TorchRL imports.

``--cpu`` runs the same Python with NumPy standing in for CuPy, on a small job and two
processes: a dry run of the code paths on a machine without a GPU (figures meaningless).
``--out DIR`` also copies every JSON there (the GPU check script passes ``$OUT``).

    python benchmarks/bench_gpu.py all --cpu          # here
    bash benchmarks/gpu_check.sh                      # on a GPU machine

Needs CuPy and a CUDA device (the ``gpu`` extra; without them it says so in one line: use
``--cpu``); ``replay`` also uses torch and TorchRL (the ``torch`` and ``bench`` extras) when they
import, and says in its figures what it left out.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import pathlib
import shutil
import statistics
import sys
import time
import traceback
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import write_results  # noqa: E402
from dask_research import montecarlo as mc  # noqa: E402
from dask_research.montecarlo import gpu  # noqa: E402
from dask_research.montecarlo.gpu import kernel  # noqa: E402
from dask_research.montecarlo.gpu.tolerance import differences  # noqa: E402
from dask_research.montecarlo.shard_compute import compute_block  # noqa: E402
from dask_research.montecarlo.tree import tree_fold  # noqa: E402


def namespace(cpu: bool) -> Any:
    if cpu:
        return np
    cp = kernel.cupy_or_none()
    if cp is None:
        raise SystemExit("no usable CuPy/CUDA device: run with --cpu for a dry run")
    return cp


def sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def gpu_name(xp: Any) -> str:
    if xp is np:
        return "numpy stand-in (--cpu)"
    props = xp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


# --- philox -----------------------------------------------------------------------------------
def part_philox(args, xp) -> dict[str, Any]:
    key = mc.Job(lambda a: a, {"a": mc.Normal(0, 1)}, shards=1, samples_per_shard=1, seed=2026).key
    n = 4099 if args.cpu else 1 << 20                       # not a multiple of 4 on purpose
    shards = [0, 1, 317, 639, 2**64 - 2]
    checks = {}
    for s in shards:
        if xp is np:
            got = gpu.draws.raw_rows(key, s, 1, n, np)[0]
        else:
            got = kernel.raw_rows_cupy(key, s << 64, 1, n).get()[0]
        want = np.random.Philox(key=key, counter=s << 64).random_raw(n)
        checks[str(s)] = {"words": n, "equal": bool(np.array_equal(got, want)),
                          "first_mismatch": (None if np.array_equal(got, want)
                                             else int(np.flatnonzero(got != want)[0]))}
    rows, words = (4, 1 << 12) if args.cpu else (640, 458_752)    # the example: 7 x 65,536 / shard
    gpu.draws.raw_rows(key, 0, 1, 16, xp)                          # compile / warm
    sync(xp)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gpu.draws.raw_rows(key, 0, rows, words, xp)
        sync(xp)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    out = {"device": gpu_name(xp), "shards_checked": checks,
           "all_equal": all(c["equal"] for c in checks.values()),
           "rate": {"rows": rows, "words_per_row": words, "seconds": t,
                    "words_per_s": rows * words / t}}
    print(f"philox: bit-equal on shards {shards}: {out['all_equal']}; "
          f"{rows * words / t / 1e9:.2f} G words/s on {out['device']}", flush=True)
    return out


# --- mc -----------------------------------------------------------------------------------------
def example_job(cpu: bool, device: str) -> mc.Job:
    sys.path.insert(0, str(ROOT / "examples"))
    import saturating_pipeline as ex

    base = ex.job
    shards, n = (32, 8192) if cpu else (base.shards, base.samples_per_shard)
    return base.replace(shards=shards, samples_per_shard=n, range=(-0.5, 1.5), device=device)


def _cpu_block(args: tuple) -> tuple[int, int, list, float]:
    job, portable, a, b = args
    red = job.make_reducer()
    t0 = time.perf_counter()
    if portable:
        blk = gpu.compute_block_portable(job, red, a, b, xp=np)
    else:
        blk = compute_block(job, red, a, b)
    return a, b, [blk.shard_states[s] for s in range(a, b)], time.perf_counter() - t0


def cpu_run(job: mc.Job, portable: bool, procs: int, block: int) -> tuple[float, list]:
    spans = [(job, portable, a, min(a + block, job.shards)) for a in range(0, job.shards, block)]
    states: list = [None] * job.shards
    # spawned, not forked: the parent has a CUDA context by now
    with cf.ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_cpu_block, spans[:procs]))              # warm every process
        t0 = time.perf_counter()
        for a, b, st, _ in pool.map(_cpu_block, spans):
            states[a:b] = st
        return time.perf_counter() - t0, states


def part_mc(args, xp) -> dict[str, Any]:
    job = example_job(args.cpu, "gpu" if not args.cpu else "any")
    ordinary = job.replace(device="cpu")
    red = job.make_reducer()
    procs = 2 if args.cpu else (os.cpu_count() or 16)
    total = job.total_samples

    # GPU: one launch per chunk of shards, warm-up (kernel compile) timed apart
    t0 = time.perf_counter()
    gpu.compute_block_portable(job, red, 0, 1, xp=xp)
    sync(xp)
    warm = time.perf_counter() - t0
    gpu_times, gpu_states = [], None
    for _ in range(2 if not args.cpu else 1):
        t0 = time.perf_counter()
        blk = gpu.compute_block_portable(job, red, 0, job.shards, xp=xp)
        sync(xp)
        gpu_times.append(time.perf_counter() - t0)
        gpu_states = [blk.shard_states[s] for s in range(job.shards)]
    t_gpu = min(gpu_times)
    print(f"mc: GPU {total / t_gpu / 1e6:,.1f} M samples/s ({t_gpu:.3f} s, warm-up {warm:.2f} s)",
          flush=True)

    block = max(1, job.shards // (procs * 4))
    t_port, cpu_states = cpu_run(job, True, procs, block)
    print(f"mc: CPU portable x{procs} {total / t_port / 1e6:,.1f} M samples/s ({t_port:.2f} s)", flush=True)
    t_ord, _ = cpu_run(ordinary, False, procs, block)
    print(f"mc: CPU ordinary x{procs} {total / t_ord / 1e6:,.1f} M samples/s ({t_ord:.2f} s)", flush=True)

    worst: dict[str, float] = {}
    bad = []
    for s, (g, c) in enumerate(zip(gpu_states, cpu_states)):
        if gpu.compare(g, c) is not None:
            bad.append(s)
        for k, v in differences(g, c).items():
            worst[k] = max(worst.get(k, 0.0), v)
    root_g = tree_fold(red.merge, gpu_states)
    root_c = tree_fold(red.merge, cpu_states)
    out = {
        "device": gpu_name(xp), "job": {"shards": job.shards, "samples_per_shard": job.samples_per_shard,
                                        "inputs": len(job.names), "id": job.id},
        "cpu_processes": procs, "cpu_block_shards": block,
        "gpu_seconds": t_gpu, "gpu_warmup_seconds": warm,
        "cpu_portable_seconds": t_port, "cpu_ordinary_seconds": t_ord,
        "samples_per_s": {"gpu": total / t_gpu, "cpu_portable": total / t_port,
                          "cpu_ordinary": total / t_ord},
        "speedup_vs_cpu_portable_same_draws": t_port / t_gpu,
        "speedup_vs_cpu_ordinary": t_ord / t_gpu,
        "goal_speedup": 20.0,
        "tolerance": gpu.GPU_TOLERANCE,
        "shards_outside_class": bad,
        "worst_scaled_difference": worst,
        "root_compare": gpu.compare(root_g, root_c),
        "root_mean": {"gpu": root_g.mean, "cpu": root_c.mean},
    }
    print(f"mc: speed-up {out['speedup_vs_cpu_portable_same_draws']:.1f}x (same draws), "
          f"{out['speedup_vs_cpu_ordinary']:.1f}x (ordinary CPU job); shards outside "
          f"{gpu.GPU_TOLERANCE}: {len(bad)}; worst {json.dumps({k: f'{v:.2g}' for k, v in worst.items()})}",
          flush=True)
    return out


# --- replay -------------------------------------------------------------------------------------
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}
BATCH = 256


def _chunks(k: int, size: int = 1024) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"obs": rng.standard_normal((size, 4), dtype=np.float32), "action": rng.integers(0, 2, size),
             "reward": rng.random(size, dtype=np.float32),
             "next_obs": rng.standard_normal((size, 4), dtype=np.float32),
             "done": rng.random(size) < 0.05} for _ in range(k)]


def _median(fn, reps: int, number: int, after=lambda: None) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        after()
        out.append((time.perf_counter() - t0) / number)
    return statistics.median(out)


def part_replay(args, xp) -> dict[str, Any]:
    from dask_research import replay

    n = 20_000 if args.cpu else 1_000_000
    number = 50 if args.cpu else 1000
    to, device = ("torch", "cpu") if args.cpu else ("torch", "cuda")
    try:
        import torch
    except ImportError:
        torch, to, device = None, "numpy", None
    spec = replay.ExperienceSpec(SPEC)
    plane = replay.ExperiencePlane(spec, capacity=n, tiers=[replay.DeviceTier(
        n * spec.itemsize, xp=np if args.cpu else None)], migrate="manual", seed=0)
    chunks = _chunks(8)
    for i in range(-(-n // 1024)):
        plane.ingest(chunks[i % len(chunks)])
    on_cuda = torch is not None and device == "cuda"
    sync_t = torch.cuda.synchronize if on_cuda else (lambda: None)
    out: dict[str, Any] = {"device": gpu_name(xp), "stored": n, "batch": BATCH, "to": to,
                           "torch_device": device}
    out["device_tier_sample_s"] = _median(lambda: plane.sample(BATCH), 3, number)
    with plane.batches(batch_size=BATCH, prefetch=0, to=to, device=device, max_batches=number) as it:
        t0 = time.perf_counter()
        for _ in it:
            pass
        sync_t()
        out["device_tier_batch_to_torch_s"] = (time.perf_counter() - t0) / number
    produce = out["device_tier_batch_to_torch_s"]
    print(f"replay: device-tier sample {out['device_tier_sample_s'] * 1e6:.0f} us, batch to "
          f"{to}:{device} {produce * 1e6:.0f} us", flush=True)

    # a learner step of about one sampling time: GIL-free sleep, and real CUDA work when there
    steps: dict[str, Any] = {"sleep": lambda: time.sleep(produce)}
    if torch is not None and device == "cuda":
        m = 256
        a = torch.randn(m, m, device="cuda")
        while True:
            t = _median(lambda a=a: a @ a, 3, 20, sync_t)
            if t >= produce or m >= 16384:
                break
            m = int(m * 1.25)
            a = torch.randn(m, m, device="cuda")

        def cuda_step() -> None:
            a @ a
            torch.cuda.synchronize()
        steps["cuda_matmul"] = cuda_step
        out["cuda_step_matrix"] = m
    lat: dict[str, Any] = {}
    for name, step in steps.items():
        for prefetch in (0, 2):
            with plane.batches(batch_size=BATCH, prefetch=prefetch, to=to, device=device,
                               max_batches=number) as it:
                for _ in it:
                    step()
            s = plane.stats()["delivery"]
            lat[f"{name}_prefetch{prefetch}"] = {k: s[k] for k in (
                "exposed_mean_s", "exposed_p50_s", "exposed_p99_s", "step_mean_s", "exposed_fraction")}
            print(f"replay: {name} prefetch {prefetch}: exposed "
                  f"{s['exposed_fraction'] * 100:.1f}% of the step", flush=True)
    out["exposed_latency"] = lat
    out["goal_exposed_fraction"] = 0.05
    plane.close()

    # TorchRL's device storage on the same machine
    try:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        dev = "cpu" if args.cpu else "cuda"
        rb = ReplayBuffer(storage=LazyTensorStorage(n, device=dev), batch_size=BATCH)
        for i in range(-(-n // 1024)):
            c = chunks[i % len(chunks)]
            rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in c.items()}, batch_size=[1024]))
        t_trl = _median(lambda: rb.sample(), 3, number, sync_t)
        out["torchrl"] = {"version": __import__("torchrl").__version__, "storage_device": dev,
                          "sample_s": t_trl,
                          "ours_over_torchrl_speed": t_trl / produce}
        print(f"replay: TorchRL {dev} sample {t_trl * 1e6:.0f} us: ours {t_trl / produce:.2f}x as "
              f"fast (goal 3x)", flush=True)
    except Exception as e:
        first = str(e).splitlines()[0][:200] if str(e) else ""
        out["torchrl"] = {"unavailable": f"{type(e).__name__}: {first}"}
        print(f"replay: TorchRL not measured ({out['torchrl']['unavailable']})", flush=True)
    return out


PARTS = {"philox": part_philox, "mc": part_mc, "replay": part_replay}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=[*PARTS, "all"])
    ap.add_argument("--cpu", action="store_true", help="NumPy stand-in, small sizes (dry run)")
    ap.add_argument("--out", default=None, help="also copy the JSON files here")
    args = ap.parse_args()
    xp = namespace(args.cpu)
    rc = 0
    for name in (PARTS if args.part == "all" else [args.part]):
        t0 = time.perf_counter()
        try:
            figures = PARTS[name](args, xp)
        except Exception as e:
            traceback.print_exc()
            figures = {"error": f"{type(e).__name__}: {e}"}
            rc = 1
        figures["seconds"] = time.perf_counter() - t0
        figures["mode"] = "cpu dry run" if args.cpu else "gpu"
        tag = f"bench_gpu_{name}" + ("_cpu" if args.cpu else "")
        note = "issue 19 GPU check" + (" (--cpu dry run)" if args.cpu else "")
        path = write_results(tag, figures, notes=note)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            shutil.copy(path, args.out)
        print(f"wrote {path}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
