"""The experience plane on a Dask cluster: learner exposed latency, env steps/s, updates/s.

Setup: a LocalCluster of 2 worker processes (2 threads each); on each worker one synthetic
actor task ingests CartPole-shaped transitions into its shard at a fixed rate for the whole
measurement (data-plane load without environment cost); one learner in this process runs a
real torch double-DQN update (MLP 4-256-256-2, batch 256, Adam) on every batch and sends the
new priorities back.

Compared, with the same plane, shards, actors and learner step:

- **plane**: ``plane.batches()``: remote sample requests kept in flight as Dask futures
  (bandwidth- and step-aware depth, batches grouped per request), priority updates shipped by
  the delivery thread;
- **sync futures**: every step submits one ``shard_ops.sample`` task per shard (sizes drawn
  the same way) and waits for them with ``client.gather``, then submits the priority updates
  (what one writes with plain Dask futures and no prefetch).

Exposed latency = time the learner waits for its batch; ratio = exposed latency / step time.
Then a short real DQN run (CartPole-v1, ``dask_research.replay.rl``) measures env steps/s and
learner updates/s end to end.

    flock /tmp/dask-research-bench.lock python benchmarks/bench_replay_cluster.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import LoadMonitor, print_table, write_results  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", 600))
BATCH = 256
PREFETCH = int(os.environ.get("BENCH_PREFETCH", 8))
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}


def make_learner():
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.set_num_threads(1)
    nn = torch.nn

    def net():
        return nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 2))

    q, qt = net(), net()
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)

    def step(obs, action, reward, next_obs, done, weights):
        obs, next_obs = torch.from_numpy(obs), torch.from_numpy(next_obs)
        with torch.no_grad():
            a = q(next_obs).argmax(1, keepdim=True)
            target = torch.from_numpy(reward) + 0.99 * torch.from_numpy(~done).float() * \
                qt(next_obs).gather(1, a).squeeze(1)
        pred = q(obs).gather(1, torch.from_numpy(action).unsqueeze(1)).squeeze(1)
        loss = (torch.from_numpy(weights) * F.smooth_l1_loss(pred, target, reduction="none")).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return (pred - target).detach().abs().numpy() + 1e-3

    return step


def run_plane(plane, step) -> dict:
    exposed, steps = [], []
    with plane.batches(batch_size=BATCH, prefetch=PREFETCH, max_batches=STEPS + 50) as it:
        for k in range(STEPS + 50):
            t0 = time.perf_counter()
            b = next(it)
            t1 = time.perf_counter()
            td = step(b.obs, b.action, b.reward, b.next_obs, b.done, b.weights)
            plane.update_priorities(b.indices, td)
            t2 = time.perf_counter()
            if k >= 50:                               # warm-up excluded
                exposed.append(t1 - t0)
                steps.append(t2 - t0)
        summary = it.summary()
    plane.flush()
    return {"exposed": exposed, "step": steps, "summary": summary}


def run_sync(plane, step) -> dict:
    from dask_research.replay.cluster import shard_ops

    client = plane.client
    exposed, steps = [], []
    for k in range(STEPS + 50):
        t0 = time.perf_counter()
        counts = plane.table.allocate(BATCH)
        futs = {sid: client.submit(shard_ops.sample, plane.name, n, plane.table[sid].uid,
                                   workers=[plane.table[sid].address], pure=False)
                for sid, n in counts.items()}
        replies = list(zip(futs, client.gather(list(futs.values()))))
        b = plane.table.assemble(replies, BATCH)
        t1 = time.perf_counter()
        td = step(b.obs, b.action, b.reward, b.next_obs, b.done, b.weights)
        plane.update_priorities(b.indices, td)        # no delivery thread: shipped at once
        t2 = time.perf_counter()
        if k >= 50:
            exposed.append(t1 - t0)
            steps.append(t2 - t0)
    plane.flush()
    return {"exposed": exposed, "step": steps}


def figures(r: dict) -> dict:
    e, s = np.array(r["exposed"]), np.array(r["step"])
    return {"exposed_mean_ms": 1e3 * e.mean(), "exposed_p50_ms": 1e3 * np.median(e),
            "exposed_p99_ms": 1e3 * np.percentile(e, 99), "step_mean_ms": 1e3 * s.mean(),
            "compute_mean_ms": 1e3 * (s - e).mean(), "exposed_fraction": e.sum() / s.sum(),
            "updates_per_s": len(s) / s.sum()}


def main() -> None:
    from distributed import Client, Event, LocalCluster

    from dask_research import replay
    from dask_research._cluster import workers_info
    from dask_research.testing.rl import cartpole_batch, synthetic_actor

    out: dict = {}
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        plane = replay.ClusterPlane(SPEC, client=client, capacity_per_worker=200_000, name="bench",
                                    sampler=replay.PrioritizedSampler(0.6, 0.4), seed=0)
        workers = sorted(workers_info(client))
        for w in workers:
            for k in range(10):
                plane.ingest(cartpole_batch(10_000, seed=k), worker=w)
        plane.refresh()
        step = make_learner()
        b = plane.sample(BATCH)
        for _ in range(20):
            step(b.obs, b.action, b.reward, b.next_obs, b.done, b.weights)
        compute = statistics.median(
            [(lambda t: (step(b.obs, b.action, b.reward, b.next_obs, b.done, b.weights),
                         time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(50)])
        rate = 20_000.0                                # transitions/s per actor
        results = {}
        for mode, fn in (("plane", run_plane), ("sync_futures", run_sync)):
            ev = Event(f"stop-{mode}")
            actors = [client.submit(synthetic_actor, plane.name, 600.0, 1024, rate, ev.name,
                                    workers=[w], pure=False, key=f"actor-{mode}-{i}")
                      for i, w in enumerate(workers)]
            time.sleep(1.0)
            with LoadMonitor() as load:
                r = fn(plane, step)
            ev.set()
            ingested = [a.result() for a in actors]
            f = figures(r)
            f["actor_ingest_per_s"] = sum(x["ingested"] / x["seconds"] for x in ingested)
            f["machine_busy"] = load.machine_busy
            if "summary" in r:
                f["delivery"] = {k: v for k, v in r["summary"].items() if k != "stages_mean_s"}
            results[mode] = f
        out["learner_compute_alone_ms"] = 1e3 * compute
        out.update(results)
        out["exposed_ratio_plane_vs_sync"] = (results["plane"]["exposed_mean_ms"]
                                              / results["sync_futures"]["exposed_mean_ms"])
        out["updates_per_s_ratio_plane_vs_sync"] = (results["plane"]["updates_per_s"]
                                                    / results["sync_futures"]["updates_per_s"])
        out["plane_stats"] = {k: v for k, v in plane.stats().items()
                              if k in ("size", "live_shards", "updates_queued", "updates_applied",
                                       "updates_dropped_lost", "bandwidth")}
        plane.close(drop=True)

        # --- end to end: a short real DQN run --------------------------------------------
        from dask_research.replay.rl import DQNConfig, train_dqn

        res = train_dqn(client, DQNConfig(target_return=1e9, max_env_steps=int(
            os.environ.get("BENCH_DQN_STEPS", 30_000)), seed=0))
        d = res.plane_stats.get("delivery", {})
        out["dqn"] = {"env_steps": res.env_steps, "updates": res.updates, "seconds": res.seconds,
                      "env_steps_per_s": res.env_steps_per_s, "updates_per_s": res.updates_per_s,
                      "final_mean_return": res.final_mean_return,
                      "exposed_fraction": d.get("exposed_fraction"),
                      "exposed_mean_ms": 1e3 * d.get("exposed_mean_s", float("nan"))}

    rows = []
    for mode in ("plane", "sync_futures"):
        f = out[mode]
        rows.append((mode, f"{f['exposed_mean_ms']:.3f}", f"{f['exposed_p50_ms']:.3f}",
                     f"{f['exposed_p99_ms']:.2f}", f"{f['step_mean_ms']:.2f}",
                     f"{100 * f['exposed_fraction']:.1f} %", f"{f['updates_per_s']:.0f}",
                     f"{f['actor_ingest_per_s']:,.0f}"))
    print(f"learner step alone (torch double-DQN update, batch {BATCH}): "
          f"{out['learner_compute_alone_ms']:.2f} ms")
    print_table(rows, ("delivery", "exposed ms", "p50 ms", "p99 ms", "step ms", "exposed/step",
                       "updates/s", "actor ingest/s"))
    print(f"exposed latency, plane / sync futures: {out['exposed_ratio_plane_vs_sync']:.3f}  "
          f"(updates/s x{out['updates_per_s_ratio_plane_vs_sync']:.2f}); goal: plane "
          f"exposed <= 5 % of step -> {100 * out['plane']['exposed_fraction']:.1f} %")
    d = out["dqn"]
    print(f"DQN CartPole end to end: {d['env_steps_per_s']:,.0f} env steps/s, "
          f"{d['updates_per_s']:,.0f} updates/s, exposed {100 * (d['exposed_fraction'] or 0):.1f} %"
          f" of a step, mean return {d['final_mean_return']:.1f} after {d['env_steps']:,} steps")
    path = write_results("bench_replay_cluster", out,
                         notes="2 worker processes x 1 synthetic actor (20k transitions/s each) "
                               "+ learner in the client, all on this machine's cores; "
                               "DQN run: 2 actors x 8 CartPole envs.")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
