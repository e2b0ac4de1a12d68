"""Experience plane vs TorchRL ReplayBuffer vs a plain preallocated numpy ring, side by side.

CartPole-sized transitions (obs float32[4], action int64, reward float32, next_obs float32[4],
done bool), 1M stored, batch 256:

- ingest in batches of 1024 into the host tier: fill 0 -> 1M and into the full ring;
- uniform sample; prioritized sample; prioritized sample + priority update;
- exposed latency of a learner whose step takes about as long as producing a batch,
  prefetch 0 vs prefetch 2 (a GIL-free learner step, like a GPU learner waiting on CUDA, and a
  numpy compute step that releases the GIL);
- ``--section memory``: bytes of RSS per stored transition of ours (no tiers, and the replay
  page's host + disk tiers), SB3's ``ReplayBuffer`` and TorchRL's ``LazyTensorStorage``, each
  filled to 10^4, 10^6 and 10^7 transitions in its own fresh subprocess, one at a time.

TorchRL is optional (``pip install dask-research[bench]``). Its prioritized sampler needs the
compiled extension ``torchrl._torchrl``, which does not load on every torch version; the
benchmark says so and compares what runs. Run one benchmark at a time:

    flock /tmp/dask-research-bench.lock python benchmarks/bench_replay.py [--quick]

Figures go to ``benchmarks/results/bench_replay.json``.
"""
from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, median_time, print_table, update_results, write_results  # noqa: E402
from dask_research import replay  # noqa: E402

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}
BATCH = 256
CHUNK = 1024
ALPHA, BETA = 0.6, 0.4
SECTIONS = ("uniform", "add", "prioritized-order", "memory", "ingest")
MEMORY_SIZES = (10**4, 10**6, 10**7)
MEMORY_BUFFERS = ("ours", "ours-tiered", "sb3", "torchrl")
# One buffer of `n` transitions, filled to `n` in chunks, in a fresh process: prints the bytes of
# record data one transition needs (the spec's itemsize, unpadded) and the growth of the RSS.
MEMORY_PROBE = """
import sys, tempfile, numpy as np, psutil
kind, n = sys.argv[1], int(sys.argv[2])
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}
m = min(n, 50_000)
rng = np.random.default_rng(0)
chunk = {"obs": rng.random((m, 4), dtype=np.float32), "action": rng.integers(0, 2, m),
         "reward": rng.random(m, dtype=np.float32), "next_obs": rng.random((m, 4), dtype=np.float32),
         "done": rng.random(m) < 0.05}
if kind.startswith("ours"):
    from dask_research import replay
    def make():
        if kind == "ours":
            return replay.ExperiencePlane(SPEC, capacity=n)
        return replay.ExperiencePlane(SPEC, capacity=n, migrate="manual",
                                      tiers=[replay.HostTier("16GiB"), replay.DiskTier(tempfile.mkdtemp())])
    def add(buf, k):
        buf.ingest({f: v[:k] for f, v in chunk.items()})
elif kind == "sb3":
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer
    envs = 1000 if n >= 10**6 else 100          # vectorised adds; the same arrays as n_envs=1
    def make():                                 # SB3 divides buffer_size by n_envs itself
        return ReplayBuffer(n, gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2),
                            device="cpu", n_envs=envs)
    def add(buf, k):
        for i in range(0, k, envs):
            s = slice(i, i + envs)
            buf.add(chunk["obs"][s], chunk["next_obs"][s], chunk["action"][s, None], chunk["reward"][s],
                    chunk["done"][s], [{}] * envs)
else:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    td = TensorDict({f: torch.from_numpy(v) for f, v in chunk.items()}, batch_size=[m])
    def make():
        return ReplayBuffer(storage=LazyTensorStorage(n), batch_size=256)
    def add(buf, k):
        buf.extend(td[:k])
proc = psutil.Process()
base = proc.memory_info().rss
buf = make()
done = 0
while done < n:
    k = min(m, n - done)
    add(buf, k)
    done += k
print(buf.size() * buf.n_envs if kind == "sb3" else len(buf), proc.memory_info().rss - base)
"""


def make_chunks(k: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"obs": rng.standard_normal((CHUNK, 4), dtype=np.float32),
             "action": rng.integers(0, 2, CHUNK),
             "reward": rng.random(CHUNK, dtype=np.float32),
             "next_obs": rng.standard_normal((CHUNK, 4), dtype=np.float32),
             "done": rng.random(CHUNK) < 0.05} for _ in range(k)]


# --- peer 1: a plain preallocated numpy ring (one structured array) ---------------------------
class NumpyRing:
    """What a careful user writes by hand: a structured ring, a slice write, a fancy gather."""

    def __init__(self, n: int, prioritized: bool = False):
        self.dtype = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"),
                               ("next_obs", "f4", (4,)), ("done", "?")])
        self.data = np.zeros(n, self.dtype)
        self.n, self.cursor, self.size = n, 0, 0
        self.rng = np.random.default_rng(0)
        self.prioritized = prioritized
        if prioritized:
            L = 1
            while L < n:
                L *= 2
            self.L, self.depth = L, L.bit_length() - 1
            self.sum = np.zeros(2 * L)
            self.mn = np.full(2 * L, np.inf)
            self.max_p = 1.0

    def _tree_set(self, idx: np.ndarray, p: np.ndarray) -> None:
        i = idx + self.L
        self.sum[i] = p
        self.mn[i] = p
        for _ in range(self.depth):
            i = i >> 1
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1]
            self.mn[i] = np.minimum(self.mn[2 * i], self.mn[2 * i + 1])

    def extend(self, b: dict[str, np.ndarray]) -> None:
        m = len(b["action"])
        rec = np.empty(m, self.dtype)
        for k, v in b.items():
            rec[k] = v
        idx = (self.cursor + np.arange(m)) % self.n
        c = self.cursor
        if c + m <= self.n:
            self.data[c:c + m] = rec
        else:
            self.data[idx] = rec
        if self.prioritized:
            self._tree_set(idx, np.full(m, self.max_p ** ALPHA))
        self.cursor = (c + m) % self.n
        self.size = min(self.size + m, self.n)

    def sample(self) -> tuple[np.ndarray, np.ndarray, Any]:
        if not self.prioritized:
            idx = self.rng.integers(0, self.size, BATCH)
            return self.data[idx], idx, None
        u = self.rng.random(BATCH) * self.sum[1]
        i = np.ones(BATCH, dtype=np.int64)
        for _ in range(self.depth):
            left = self.sum[2 * i]
            go = u >= left
            u = np.where(go, u - left, u)
            i = 2 * i + go
        idx = i - self.L
        p = self.sum[i]
        w = (p / self.mn[1]) ** -BETA
        return self.data[idx], idx, w

    def update(self, idx: np.ndarray, pr: np.ndarray) -> None:
        self.max_p = max(self.max_p, float(pr.max()))
        self._tree_set(idx, pr ** ALPHA)


# --- peer 1b: a columnar ring (one array per field), the best hand-written uniform ring --------
class ColumnarRing:
    """What a careful user writes for uniform replay: one preallocated array per field, slice
    writes, one index array and ``np.take(..., out=)`` into preallocated batch buffers.

    ``sample()`` reuses its output buffers (the next call overwrites the batch; ours returns
    fresh arrays); ``sample_fresh()`` allocates, like ours.
    """

    def __init__(self, n: int, spec: dict[str, Any] = SPEC, batch: int = BATCH):
        self.cols = {k: np.zeros((n, *s), d) for k, (s, d) in spec.items()}
        self.out = {k: np.empty((batch, *s), d) for k, (s, d) in spec.items()}
        self.n, self.cursor, self.size, self.batch = n, 0, 0, batch
        self.rng = np.random.default_rng(0)

    def extend(self, b: dict[str, np.ndarray]) -> None:
        m = len(b["action"])
        c = self.cursor
        first = min(m, self.n - c)
        for k, v in b.items():
            col = self.cols[k]
            col[c:c + first] = v[:first]
            if first < m:
                col[:m - first] = v[first:]
        self.cursor = (c + m) % self.n
        self.size = min(self.size + m, self.n)

    def add(self, **t: Any) -> None:
        """One transition, one indexed store per field (the columnar analogue of SB3's add)."""
        c = self.cursor
        for k, v in t.items():
            self.cols[k][c] = v
        self.cursor = (c + 1) % self.n
        self.size = min(self.size + 1, self.n)

    def sample(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        idx = self.rng.integers(0, self.size, self.batch)
        out = self.out
        for k, col in self.cols.items():
            np.take(col, idx, axis=0, out=out[k], mode="clip")   # "raise" would buffer out
        return out, idx

    def sample_float_draw(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """As :meth:`sample`, with the indices drawn as ours are (floor of 53-bit floats)."""
        u = self.rng.random(self.batch)
        u *= self.size
        idx = u.astype(np.int64)
        out = self.out
        for k, col in self.cols.items():
            np.take(col, idx, axis=0, out=out[k], mode="clip")
        return out, idx

    def sample_fresh(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        idx = self.rng.integers(0, self.size, self.batch)
        return {k: np.take(col, idx, axis=0) for k, col in self.cols.items()}, idx


def interleaved(cases: dict[str, Callable[[], Any]], reps: int, number: int) -> dict[str, Any]:
    """Per case: median over ``reps`` interleaved rounds (every case once per round, the order
    rotating) of the mean seconds per call over ``number`` calls; and every round's figure."""
    names = list(cases)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            fn = cases[k]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            per[k].append((time.perf_counter() - t0) / number)
    return {k: {"median_s": statistics.median(v), "rounds_s": v} for k, v in per.items()}


def uniform_side_by_side(N: int, reps: int, number: int) -> dict[str, Any]:
    """Uniform sample(256) of 1M CartPole transitions: ours (sample, batches prefetch 0 and 2
    with no learner work) against the columnar and the structured hand-written rings, in one
    process, interleaved. Ratios are ``peer time / our time`` (> 1: ours faster)."""
    chunks = make_chunks(16)
    plane = replay.ExperiencePlane(SPEC, N, seed=0)
    col, rec = ColumnarRing(N), NumpyRing(N)
    for i in range(-(-N // CHUNK)):
        c = chunks[i % len(chunks)]
        plane.ingest(c)
        col.extend(c)
        rec.extend(c)
    it0 = plane.batches(BATCH, prefetch=0)
    it2 = plane.batches(BATCH, prefetch=2)
    for _ in range(50):
        next(it0), next(it2)
    try:
        res = interleaved({
            "columnar ring, np.take out= clip": col.sample,
            "columnar ring, np.take fresh": col.sample_fresh,
            "columnar ring, float draws, np.take out= clip": col.sample_float_draw,
            "structured ring, fancy index": rec.sample,
            "ours plane.sample": lambda: plane.sample(BATCH),
            "ours batches prefetch=0": lambda: next(it0),
            "ours batches prefetch=2, no learner work": lambda: next(it2),
        }, reps, number)
    finally:
        it0.close()
        it2.close()
        plane.close()
    med = {k: v["median_s"] for k, v in res.items()}
    best = min(med["columnar ring, np.take out= clip"], med["columnar ring, np.take fresh"],
               med["columnar ring, float draws, np.take out= clip"])
    out: dict[str, Any] = {"cases": res, "best_hand_written_s": best,
                           "ratio_best_hand_written_over_ours": {
                               k: best / v for k, v in med.items() if k.startswith("ours")},
                           "ratio_structured_over_ours": {
                               k: med["structured ring, fancy index"] / v
                               for k, v in med.items() if k.startswith("ours")}}
    s = med["ours plane.sample"]
    out["iterator_overhead_per_batch"] = {
        "prefetch0_s": med["ours batches prefetch=0"] - s,
        "prefetch2_no_work_s": med["ours batches prefetch=2, no learner work"] - s,
        "prefetch0_over_sample": med["ours batches prefetch=0"] / s,
        "prefetch2_no_work_over_sample": med["ours batches prefetch=2, no learner work"] / s}
    return out


def single_add(reps: int, number: int) -> dict[str, Any]:
    """One transition at a time (CartPole): ours ``plane.add`` and ``plane.ingest`` of one
    transition against SB3's ``ReplayBuffer.add`` (if importable) and a columnar add."""
    n = 200_000
    o = np.ones(4, np.float32)
    plane = replay.ExperiencePlane(SPEC, n, seed=0)
    col = ColumnarRing(n)
    one = {"obs": o, "action": 1, "reward": 0.5, "next_obs": o, "done": False}
    cases: dict[str, Callable[[], Any]] = {
        "ours plane.add": lambda: plane.add(obs=o, action=1, reward=0.5, next_obs=o, done=False),
        "ours plane.ingest(one)": lambda: plane.ingest(one),
        "columnar add": lambda: col.add(obs=o, action=1, reward=0.5, next_obs=o, done=False),
    }
    note = ""
    try:
        import warnings

        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sb3 = ReplayBuffer(n, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                               gym.spaces.Discrete(2), device="cpu", n_envs=1)
        o1, a1 = o[None], np.array([1])
        r1, d1, inf = np.array([0.5], np.float32), np.array([False]), [{}]
        cases["SB3 ReplayBuffer.add"] = lambda: sb3.add(o1, o1, a1, r1, d1, inf)
    except Exception as e:  # not installed
        note = f"stable-baselines3 not importable ({type(e).__name__}); compared with a columnar add"
    try:
        res = interleaved(cases, reps, number)
    finally:
        plane.close()
    med = {k: v["median_s"] for k, v in res.items()}
    peer = "SB3 ReplayBuffer.add" if "SB3 ReplayBuffer.add" in med else "columnar add"
    return {"cases": res, "peer": peer, "note": note,
            "ratio_peer_over_ours_add": med[peer] / med["ours plane.add"],
            "ratio_ingest_one_over_add": med["ours plane.ingest(one)"] / med["ours plane.add"]}


def prioritized_order(N: int, reps: int, number: int) -> dict[str, Any]:
    """Cost of returning prioritized batches in draw order (shuffle=True) vs sorted by slot."""
    chunks = make_chunks(16)
    planes = {s: replay.ExperiencePlane(SPEC, N, seed=0,
                                        sampler=replay.PrioritizedSampler(ALPHA, BETA, shuffle=s))
              for s in (True, False)}
    pr = np.random.default_rng(2).random(N) + 0.01
    for p in planes.values():
        for i in range(-(-N // CHUNK)):
            p.ingest(chunks[i % len(chunks)])
        p.update_priorities(np.arange(p.total - N, p.total), pr)
    try:
        res = interleaved({"shuffle=True (draw order)": lambda: planes[True].sample(BATCH),
                           "shuffle=False (sorted by slot)": lambda: planes[False].sample(BATCH)},
                          reps, number)
    finally:
        for p in planes.values():
            p.close()
    med = {k: v["median_s"] for k, v in res.items()}
    return {"cases": res, "ratio_shuffled_over_sorted":
            med["shuffle=True (draw order)"] / med["shuffle=False (sorted by slot)"]}


def run_sections(sections: list[str], N: int, quick: bool) -> dict[str, Any]:
    reps = 5 if quick else 9
    out: dict[str, Any] = {}
    if "uniform" in sections:
        out["uniform_side_by_side"] = uniform_side_by_side(N, reps, 300 if quick else 1000)
        u = out["uniform_side_by_side"]
        rows = [(k, us(v["median_s"]), ratio(u["best_hand_written_s"], v["median_s"]))
                for k, v in u["cases"].items()]
        print_table(rows, ("uniform sample(256)", "median", "best hand-written / this"))
        o = u["iterator_overhead_per_batch"]
        print(f"iterator overhead per batch over plane.sample: prefetch 0 {us(o['prefetch0_s'])}, "
              f"prefetch 2 without learner work {us(o['prefetch2_no_work_s'])}")
    if "add" in sections:
        out["single_add"] = a = single_add(reps, 2000 if quick else 10000)
        print_table([(k, f"{v['median_s'] * 1e6:.2f} us") for k, v in a["cases"].items()],
                    ("one transition", "median"))
        print(f"{a['peer']} / ours plane.add: {a['ratio_peer_over_ours_add']:.2f}x")
    if "memory" in sections:
        out["memory"] = memory_side_by_side()
    if "ingest" in sections:             # the full run measures it first, with the sampling rows
        ing, buffers = ingest_side_by_side(N, 1 if quick else 3, 50 if quick else 200, make_chunks(16),
                                           torchrl_status())
        for b in buffers.values():
            if isinstance(b, replay.ExperiencePlane):
                b.close()
        out["ingest"] = ing
    if "prioritized-order" in sections:
        out["prioritized_order"] = q = prioritized_order(N, reps, 300 if quick else 1000)
        print(f"prioritized sample(256): draw order / sorted by slot = "
              f"{q['ratio_shuffled_over_sorted']:.3f}")
    return out


def memory_side_by_side(sizes: tuple[int, ...] = MEMORY_SIZES) -> dict[str, Any]:
    """RSS growth per stored transition of each buffer filled to ``n``, one fresh process each."""
    import os
    import subprocess

    need = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in SPEC.values())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    out: dict[str, Any] = {"record_bytes_unpadded": need,
                           "record_bytes_ours": replay.ExperienceSpec(SPEC).itemsize, "cases": {}}
    for n in sizes:
        for kind in MEMORY_BUFFERS:
            r = subprocess.run([sys.executable, "-c", MEMORY_PROBE, kind, str(n)], env=env,
                               capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                msg = (r.stderr.strip().splitlines() or ["?"])[-1][:200]
                out["cases"][f"{kind} {n}"] = {"error": msg}
                print(f"{kind:12s} {n:>11,}  skipped: {msg}")
                continue
            size, rss = map(int, r.stdout.split()[-2:])
            if size != n:                # a buffer that kept fewer measures its fixed costs, not n
                out["cases"][f"{kind} {n}"] = {"error": f"stored {size:,} of {n:,}"}
                print(f"{kind:12s} {n:>11,}  not measured: it stored {size:,} of {n:,} transitions")
                continue
            case = {"buffer": kind, "n": n, "stored": size, "rss_bytes": rss,
                    "rss_bytes_per_transition": rss / size, "over_unpadded_record": rss / size / need}
            out["cases"][f"{kind} {n}"] = case
            print(f"{kind:12s} {n:>11,}  {rss / size:8.1f} B/transition "
                  f"({case['over_unpadded_record']:.2f}x the {need} B of its fields)")
    return out


# --- peer 2: TorchRL ----------------------------------------------------------------------------
def torchrl_status() -> dict[str, Any]:
    """Which TorchRL paths run here; never raises."""
    out: dict[str, Any] = {"available": False, "uniform": False, "prioritized": False, "note": ""}
    try:
        import torchrl
        from tensordict import TensorDict  # noqa: F401
        from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: F401
    except Exception as e:  # not installed, or broken
        out["note"] = f"TorchRL not importable ({type(e).__name__}: {e}); pip install dask-research[bench]"
        return out
    out["available"] = True
    out["version"] = torchrl.__version__
    out["uniform"] = True
    try:
        from torchrl.data import PrioritizedSampler

        s = PrioritizedSampler(max_capacity=16, alpha=ALPHA, beta=BETA)
        del s
        out["prioritized"] = True
    except Exception as e:
        msg = str(e).splitlines()[0][:200]
        out["note"] = (f"TorchRL's PrioritizedSampler does not run with this torch "
                       f"({type(e).__name__}: {msg}); its compiled extension torchrl._torchrl "
                       "was built against another torch ABI. TorchRL prioritized figures are "
                       "skipped in this run (docs/replay.rst quotes figures measured with a "
                       "rebuilt extension).")
    return out


def torchrl_buffer(n: int, prioritized: bool):
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

    if prioritized:
        return ReplayBuffer(storage=LazyTensorStorage(n), batch_size=BATCH,
                            sampler=PrioritizedSampler(max_capacity=n, alpha=ALPHA, beta=BETA))
    return ReplayBuffer(storage=LazyTensorStorage(n), batch_size=BATCH)


def torchrl_chunks(chunks: list[dict[str, np.ndarray]]):
    import torch
    from tensordict import TensorDict

    return [TensorDict({k: torch.from_numpy(v) for k, v in c.items()}, batch_size=[CHUNK])
            for c in chunks]


# --- measurement helpers --------------------------------------------------------------------------
def fill_time(make: Callable[[], Any], add: Callable[[Any, Any], None], chunks: list, n: int,
              extra: int, repeat: int) -> dict[str, float]:
    """Median over ``repeat`` fresh buffers of: construction, fill 0 -> n, ``extra`` more chunks."""
    build, fill, full = [], [], []
    steps = -(-n // CHUNK)
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        buf = make()
        t1 = time.perf_counter()
        for i in range(steps):
            add(buf, chunks[i % len(chunks)])
        t2 = time.perf_counter()
        for i in range(extra):
            add(buf, chunks[i % len(chunks)])
        t3 = time.perf_counter()
        build.append(t1 - t0)
        fill.append((t2 - t1) / (steps * CHUNK))
        full.append((t3 - t2) / (extra * CHUNK))
        last = buf
    return {"construct_s": statistics.median(build), "fill_s_per_transition": statistics.median(fill),
            "full_s_per_transition": statistics.median(full), "_buffer": last}


def rate(s_per: float) -> str:
    return f"{1 / s_per / 1e6:.1f} M/s"


def us(s: float) -> str:
    return f"{s * 1e6:.0f} us"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}x"


# --- exposed latency ----------------------------------------------------------------------------
def exposed_latency(plane: replay.ExperiencePlane, batches: int, to: str) -> dict[str, Any]:
    """Learner step ~ producing one batch; prefetch 0 vs 2; sleep step and numpy step."""
    # production time of one batch (sample + gather + copy), measured through the pipeline
    with plane.batches(batch_size=BATCH, prefetch=0, to=to, max_batches=300) as it:
        for _ in it:
            pass
    d = plane.stats()["delivery"]
    produce = sum(d["stages_mean_s"][k] for k in ("sample", "gather", "transform", "copy"))
    # a numpy step of about that length that releases the GIL (one ufunc over a large array)
    m = 1024
    while True:
        x = np.random.default_rng(0).random(m)
        y = np.empty_like(x)
        t = median_time(lambda x=x, y=y: np.sqrt(x, out=y), repeat=3, number=200)
        if t >= produce or m > 1 << 26:
            break
        m = int(m * 1.3)

    def sleep_step() -> None:
        time.sleep(produce)

    def numpy_step() -> None:
        np.sqrt(x, out=y)

    out: dict[str, Any] = {"produce_s": produce, "numpy_step_elements": m}
    for name, step in (("sleep", sleep_step), ("numpy", numpy_step)):
        for prefetch in (0, 2):
            with plane.batches(batch_size=BATCH, prefetch=prefetch, to=to,
                               max_batches=batches) as it:
                for _ in it:
                    step()
            s = plane.stats()["delivery"]
            out[f"{name}_prefetch{prefetch}"] = {
                "exposed_mean_s": s["exposed_mean_s"], "exposed_p50_s": s["exposed_p50_s"],
                "exposed_p99_s": s["exposed_p99_s"], "step_mean_s": s["step_mean_s"],
                "exposed_fraction": s["exposed_fraction"]}
    return out


def ingest_side_by_side(N: int, reps: int, extra: int, chunks: list, trl: dict[str, Any]) -> tuple[dict, dict]:
    """Fill 0 -> ``N`` and ``extra`` chunks into the full ring, for ours, the numpy ring and
    TorchRL (where it runs); the figures and the filled buffers (for the sampling rows)."""
    ing: dict[str, dict[str, float]] = {}
    buffers: dict[str, Any] = {}
    cases = {
        "ours uniform": (lambda: replay.ExperiencePlane(SPEC, N, seed=0),
                         lambda b, c: b.ingest(c), chunks),
        "ours prioritized": (lambda: replay.ExperiencePlane(
            SPEC, N, seed=0, sampler=replay.PrioritizedSampler(ALPHA, BETA)),
            lambda b, c: b.ingest(c), chunks),
        "numpy ring": (lambda: NumpyRing(N), lambda b, c: b.extend(c), chunks),
        "numpy ring prioritized": (lambda: NumpyRing(N, True), lambda b, c: b.extend(c), chunks),
    }
    if trl["uniform"]:
        tchunks = torchrl_chunks(chunks)
        cases["torchrl"] = (lambda: torchrl_buffer(N, False), lambda b, c: b.extend(c), tchunks)
        if trl["prioritized"]:
            cases["torchrl prioritized"] = (lambda: torchrl_buffer(N, True),
                                            lambda b, c: b.extend(c), tchunks)
    # The fill pays the kernel's first-touch page faults, whose cost depends on what the process
    # allocated and freed before (the first buffer of a fresh process paid 3-5x): one untimed fill
    # first, then the cases round-robin, in alternating order, and the median of each.
    fill_time(cases["numpy ring"][0], cases["numpy ring"][1], chunks, N, 1, 1)
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    names = list(cases)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            make, add, ch = cases[name]
            r = fill_time(make, add, ch, N, extra, 1)
            buffers[name] = r.pop("_buffer")
            runs[name].append(r)
            if rep < reps - 1:
                buffers.pop(name)
    for name, rs in runs.items():
        r = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        ing[name] = r
        print(f"ingest {name:<24} construct {r['construct_s']:.3f} s, "
              f"fill {rate(r['fill_s_per_transition'])}, "
              f"full ring {rate(r['full_s_per_transition'])} (median of {len(rs)}, interleaved)", flush=True)
    return ing, buffers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100k stored, fewer reps (smoke run)")
    ap.add_argument("--section", action="append", choices=list(SECTIONS),
                    help="run only these sections and merge their figures into the JSON")
    args = ap.parse_args()
    N = 100_000 if args.quick else 1_000_000
    if args.section:
        with LoadMonitor() as load:
            figs = run_sections(args.section, N, args.quick)
        for f in figs.values():
            f["machine_busy"], f["own_busy"] = load.machine_busy, load.own_busy
        print(f"\nmachine busy {load.machine_busy:.0%} of all cores, this process {load.own_busy:.0%}")
        print("wrote", update_results("bench_replay", figs))
        return
    reps = 1 if args.quick else 3
    n_samples = 300 if args.quick else 2000
    extra = 50 if args.quick else 200
    chunks = make_chunks(16)
    trl = torchrl_status()
    if trl["note"]:
        print("NOTE:", trl["note"])
    figures: dict[str, Any] = {"stored": N, "batch": BATCH, "ingest_chunk": CHUNK,
                               "torchrl": {k: v for k, v in trl.items()}}
    buffers: dict[str, Any] = {}

    with LoadMonitor() as load:
        # ---- ingest -------------------------------------------------------------------------
        ing, buffers = ingest_side_by_side(N, reps, extra, chunks, trl)
        figures["ingest"] = ing

        # ---- uniform and prioritized sampling -------------------------------------------------
        smp: dict[str, float] = {}
        prio_upd = np.random.default_rng(1).random(BATCH) + 0.01
        smp["ours uniform"] = median_time(lambda: buffers["ours uniform"].sample(BATCH), reps, n_samples)
        smp["numpy ring uniform"] = median_time(lambda: buffers["numpy ring"].sample(), reps, n_samples)
        if "torchrl" in buffers:
            smp["torchrl uniform"] = median_time(lambda: buffers["torchrl"].sample(), reps, n_samples)
        ours_p = buffers["ours prioritized"]
        ring_p = buffers["numpy ring prioritized"]
        smp["ours prioritized"] = median_time(lambda: ours_p.sample(BATCH), reps, n_samples)
        smp["numpy ring prioritized"] = median_time(lambda: ring_p.sample(), reps, n_samples)

        def ours_su() -> None:
            b = ours_p.sample(BATCH)
            ours_p.update_priorities(b.indices, prio_upd)

        def ring_su() -> None:
            _, idx, _ = ring_p.sample()
            ring_p.update(idx, prio_upd)

        smp["ours prioritized+update"] = median_time(ours_su, reps, n_samples)
        smp["numpy ring prioritized+update"] = median_time(ring_su, reps, n_samples)
        if "torchrl prioritized" in buffers:
            import torch

            trb = buffers["torchrl prioritized"]
            tp = torch.from_numpy(prio_upd)
            smp["torchrl prioritized"] = median_time(lambda: trb.sample(), reps, n_samples)

            def trl_su() -> None:
                _, info = trb.sample(return_info=True)
                trb.update_priority(info["index"], tp)

            smp["torchrl prioritized+update"] = median_time(trl_su, reps, n_samples)
        figures["sample_s_per_batch"] = smp

        # ---- exposed latency ----------------------------------------------------------------
        try:
            import torch  # noqa: F401
            to = "torch"
        except ImportError:
            to = "numpy"
        figures["exposed_latency"] = {"to": to, "sampler": "prioritized",
                                      **exposed_latency(ours_p, 300 if args.quick else 1500, to)}
        for b in buffers.values():            # free the 1M-transition buffers first
            if isinstance(b, replay.ExperiencePlane):
                b.close()
        buffers.clear()
        gc.collect()
        figures.update(run_sections([k for k in SECTIONS if k != "ingest"], N, args.quick))
    figures["machine_busy"] = load.machine_busy
    figures["own_busy"] = load.own_busy

    # ---- tables ------------------------------------------------------------------------------
    print()
    get = lambda k: smp.get(k)  # noqa: E731
    rows = [
        ("uniform sample(256)", us(smp["ours uniform"]), us(smp["numpy ring uniform"]),
         us(get("torchrl uniform")) if get("torchrl uniform") else "n/a",
         ratio(smp["numpy ring uniform"], smp["ours uniform"]),
         ratio(get("torchrl uniform"), smp["ours uniform"])),
        ("prioritized sample(256)", us(smp["ours prioritized"]), us(smp["numpy ring prioritized"]),
         us(get("torchrl prioritized")) if get("torchrl prioritized") else "n/a",
         ratio(smp["numpy ring prioritized"], smp["ours prioritized"]),
         ratio(get("torchrl prioritized"), smp["ours prioritized"])),
        ("prioritized sample+update", us(smp["ours prioritized+update"]),
         us(smp["numpy ring prioritized+update"]),
         us(get("torchrl prioritized+update")) if get("torchrl prioritized+update") else "n/a",
         ratio(smp["numpy ring prioritized+update"], smp["ours prioritized+update"]),
         ratio(get("torchrl prioritized+update"), smp["ours prioritized+update"])),
    ]
    for label, key in (("fill 0->1M", "fill_s_per_transition"), ("full ring", "full_s_per_transition")):
        o, r = ing["ours uniform"][key], ing["numpy ring"][key]
        t = ing.get("torchrl", {}).get(key)
        rows.append((f"ingest(1024) uniform, {label}", rate(o), rate(r), rate(t) if t else "n/a",
                     ratio(r, o), ratio(t, o)))
        o, r = ing["ours prioritized"][key], ing["numpy ring prioritized"][key]
        t = ing.get("torchrl prioritized", {}).get(key)
        rows.append((f"ingest(1024) prioritized, {label}", rate(o), rate(r), rate(t) if t else "n/a",
                     ratio(r, o), ratio(t, o)))
    print_table(rows, ("operation", "ours", "numpy ring", "TorchRL", "ours vs numpy", "ours vs TorchRL"))
    print("\n(ratios: how many times faster ours is; construction times (no prefault: pages are touched as rows are written):",
          ", ".join(f"{k} {v['construct_s']:.3f} s" for k, v in ing.items()) + ")")
    el = figures["exposed_latency"]
    print(f"\nexposed latency, prioritized plane -> {el['to']}, batch {BATCH}, one batch takes "
          f"{us(el['produce_s'])} to produce:")
    erows = []
    for name in ("sleep", "numpy"):
        for pf in (0, 2):
            e = el[f"{name}_prefetch{pf}"]
            erows.append((f"{name} step", pf, us(e["step_mean_s"]), us(e["exposed_mean_s"]),
                          us(e["exposed_p50_s"]), us(e["exposed_p99_s"]),
                          f"{e['exposed_fraction']:.1%}"))
    print_table(erows, ("learner", "prefetch", "step", "exposed mean", "exposed p50", "exposed p99",
                        "exposed / step"))
    print(f"\nmachine busy {load.machine_busy:.0%} of all cores, this process {load.own_busy:.0%}")
    notes = trl["note"]
    path = write_results("bench_replay", figures, notes=notes)
    print("wrote", path)
    for b in buffers.values():
        if isinstance(b, replay.ExperiencePlane):
            b.close()


if __name__ == "__main__":
    main()
