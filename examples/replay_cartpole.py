"""The experience plane end to end on one process, on the CPU.

An actor thread steps a tiny CartPole-like simulator (no gym needed) and ingests transitions; a
learner trains a small Q-network with prioritized replay from prefetched batches, sending back
new priorities; a rate limiter keeps about 4 samples per inserted transition. The plane has
three tiers: a small fast host tier standing in for the GPU, a host tier and a disk tier. At the
end the script prints where the data lives and why, the delivery figures (exposed latency),
and checks that a checkpoint restores the same contents.

    python examples/replay_cartpole.py

torch is used if installed (``pip install dask-research[torch]``); otherwise a numpy linear
learner does the same loop. In this one-process demo the actor thread competes with the learner
and the delivery thread for the GIL, so the exposed latency is higher than in
``benchmarks/bench_replay.py``; on a cluster the actors run in other processes.
"""
from __future__ import annotations

import tempfile
import threading
import time

import numpy as np

from dask_research import replay
from dask_research.exceptions import RateLimitTimeout

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}


def actor(plane: replay.ExperiencePlane, stop: threading.Event, seed: int = 0) -> None:
    """Random-policy rollouts of linearised cart-pole dynamics, ingested 256 at a time, until
    ``stop``; the rate limiter paces it to the learner."""
    rng = np.random.default_rng(seed)
    A = np.eye(4) + 0.02 * np.array([[0, 1, 0, 0], [0, 0, -0.7, 0], [0, 0, 0, 1], [0, 0, 15.8, 0]])
    B = 0.02 * np.array([0, 1.0, 0, -1.5])
    x = rng.uniform(-0.05, 0.05, 4)
    buf = {k: [] for k in SPEC}
    while not stop.is_set():
        a = int(rng.integers(0, 2))
        nx = A @ x + B * (2 * a - 1)
        done = bool(abs(nx[2]) > 0.21 or abs(nx[0]) > 2.4)
        for k, v in (("obs", x), ("action", a), ("reward", 1.0), ("next_obs", nx), ("done", done)):
            buf[k].append(v)
        x = rng.uniform(-0.05, 0.05, 4) if done else nx
        if len(buf["action"]) == 256:
            batch = {k: np.asarray(v, dtype=SPEC[k][1]) for k, v in buf.items()}
            while not stop.is_set():
                try:
                    plane.ingest(batch, timeout=0.5)
                    break
                except RateLimitTimeout:      # the learner is behind: wait, or stop
                    continue
            buf = {k: [] for k in SPEC}


def make_learner():
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.manual_seed(0)
        q = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        opt = torch.optim.Adam(q.parameters(), lr=1e-3)

        def step(b):
            with torch.no_grad():
                target = b.reward + 0.99 * (~b.done) * q(b.next_obs).max(1).values
            pred = q(b.obs).gather(1, b.action[:, None]).squeeze(1)
            td = pred - target
            loss = (b.weights * td ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item(), td.detach().abs().numpy()

        return "torch", step
    W = np.zeros((4, 2))

    def step(b):
        nonlocal W
        target = b.reward + 0.99 * (~b.done) * (b.next_obs @ W).max(1)
        pred = (b.obs @ W)[np.arange(b.size), b.action]
        td = pred - target
        grad = np.zeros_like(W)
        np.add.at(grad.T, b.action, (b.weights * td)[:, None] * b.obs)
        W -= 1e-3 * grad / b.size
        return float((b.weights * td ** 2).mean()), np.abs(td)

    return "numpy", step


def main() -> None:
    item = replay.ExperienceSpec(SPEC).itemsize
    tmp = tempfile.mkdtemp(prefix="replay-example-")
    tiers = [replay.HostTier(20_000 * item, bandwidth=20e9, name="fast"),   # stands in for a GPU
             replay.HostTier(60_000 * item, bandwidth=8e9, name="host"),
             replay.DiskTier(tmp, 120_000 * item, bandwidth=1e9)]
    limiter = replay.RateLimiter(samples_per_insert=4, tolerance=20_000, min_size_to_sample=2_000,
                                 timeout=30)
    plane = replay.ExperiencePlane(SPEC, tiers=tiers, rate_limiter=limiter, seed=0,
                                   sampler=replay.PrioritizedSampler(alpha=0.6, beta=0.4))
    to = "torch"
    kind, learn = make_learner()
    if kind == "numpy":
        to = "numpy"
    stop = threading.Event()
    th = threading.Thread(target=actor, args=(plane, stop), daemon=True)
    t0 = time.perf_counter()
    th.start()
    losses = []
    with plane.batches(batch_size=256, prefetch=2, to=to, max_batches=800,
                       transforms=[replay.NStepReturn(n=3, gamma=0.99)]) as it:
        for batch in it:
            loss, td = learn(batch)
            plane.update_priorities(batch.indices, td + 1e-3)
            losses.append(loss)
    stop.set()
    th.join()
    wall = time.perf_counter() - t0
    s = plane.stats()
    d = s["delivery"]
    print(f"{kind} learner: {d['batches']} batches in {wall:.1f} s, loss {np.mean(losses[:50]):.3f} -> "
          f"{np.mean(losses[-50:]):.3f}")
    print(f"stored {s['size']:,} of {s['inserted']:,} inserted; sampled {s['sampled']:,} "
          f"(ratio {s['sampled'] / max(s['inserted'], 1):.2f}, target 4)")
    print(f"exposed latency {d['exposed_mean_s'] * 1e6:.0f} us per batch (p99 "
          f"{d['exposed_p99_s'] * 1e6:.0f} us) = {d['exposed_fraction']:.1%} of the learner's step "
          f"({d['step_mean_s'] * 1e6:.0f} us)")
    print("stage means (us):", {k: round(v * 1e6) for k, v in d["stages_mean_s"].items()})
    plane.rebalance()
    print(plane.placement())
    plane.checkpoint(f"{tmp}/checkpoint")
    again = replay.ExperiencePlane.restore(f"{tmp}/checkpoint")
    same = all(np.array_equal(a, b) for a, b in zip(plane.contents().values(),
                                                    again.contents().values()))
    print(f"checkpoint restored {len(again):,} transitions, identical: {same}")
    again.close()
    plane.close()


if __name__ == "__main__":
    main()
