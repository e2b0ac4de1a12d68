"""SB3's own ReplayBuffer vs SB3ReplayBuffer (the experience plane), side by side.

1. DQN on CartPole-v1 (SB3's RL-zoo hyperparameters, a smaller MLP, torch on one thread),
   several seeds, each seed with both buffers in turn (order alternating): environment steps
   per second of ``learn`` (wall clock, and per CPU-second of this process, which a loaded
   machine disturbs less) and the final return (mean of 10 deterministic evaluation
   episodes). Same seeds do not mean the same run: SB3's buffer draws from numpy's global
   generator, which also drives DQN's exploration, while ours draws from the plane's; with
   ``sb3_sampling=True`` the runs are identical (tests/replay/integrations/test_sb3.py).
2. Buffer only, CartPole-sized transitions: one ``add`` (one env) and one ``sample(256)``
   (SB3's ``ReplayBufferSamples`` on the CPU), interleaved repeats, medians.

Ratios are ours / SB3's (times: < 1 is faster; steps/s: > 1 is faster). Run one benchmark at a
time:

    flock /tmp/dask-research-bench.lock python benchmarks/bench_integrations.py [--quick]

Figures go to ``benchmarks/results/bench_integrations.json``. Needs ``stable-baselines3``,
``gymnasium`` and ``torch`` (the ``bench`` extra); without one it says so in one line and stops.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.harness import LoadMonitor, print_table, require, write_results  # noqa: E402

#: SB3 RL-zoo DQN CartPole-v1 hyperparameters (net 64x64 instead of 256x256, to fit 2 cores)
DQN_CARTPOLE = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                    learning_starts=1_000, gamma=0.99, target_update_interval=10,
                    train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                    exploration_final_eps=0.04, policy_kwargs={"net_arch": [64, 64]})


def dqn_cartpole(buffer: str, seed: int, steps: int) -> dict[str, float]:
    """Train DQN on CartPole with ``buffer`` ("sb3" or "ours"); steps/s and final return."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.evaluation import evaluate_policy

    from dask_research.replay.integrations import SB3ReplayBuffer

    torch.set_num_threads(1)
    kw: dict[str, Any] = {}
    if buffer == "ours":
        kw["replay_buffer_class"] = SB3ReplayBuffer
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", **DQN_CARTPOLE, **kw)
    t0, c0 = time.perf_counter(), time.process_time()
    model.learn(steps)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=10, deterministic=True)
    return {"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu, "return": float(mean),
            "return_std": float(std), "wall_s": wall, "cpu_s": cpu}


def buffer_only(n_add: int, n_sample: int, repeat: int) -> dict[str, Any]:
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    from dask_research.replay.integrations import SB3ReplayBuffer

    env = gym.make("CartPole-v1")
    os_, as_ = env.observation_space, env.action_space
    cap = 100_000
    bufs = {"sb3": ReplayBuffer(cap, os_, as_, device="cpu"),
            "ours": SB3ReplayBuffer(cap, os_, as_, device="cpu", seed=0)}
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n_add, 1, 4)).astype(np.float32)
    act = rng.integers(0, 2, (n_add, 1))
    rew = np.ones((n_add, 1), np.float32)
    done = rng.random((n_add, 1)) < 0.05
    infos = [[{}] for _ in range(n_add)]
    add = {k: [] for k in bufs}
    smp = {k: [] for k in bufs}
    for _ in range(repeat):
        for name, b in bufs.items():
            t0 = time.perf_counter()
            for i in range(n_add):
                b.add(obs[i], obs[i], act[i], rew[i], done[i], infos[i])
            add[name].append((time.perf_counter() - t0) / n_add)
        for name, b in bufs.items():
            b.sample(256)
            t0 = time.perf_counter()
            for _ in range(n_sample):
                b.sample(256)
            smp[name].append((time.perf_counter() - t0) / n_sample)
    out = {}
    for name in bufs:
        out[name] = {"add_us": statistics.median(add[name]) * 1e6,
                     "sample256_us": statistics.median(smp[name]) * 1e6}
    out["add_ratio"] = out["ours"]["add_us"] / out["sb3"]["add_us"]
    out["sample_ratio"] = out["ours"]["sample256_us"] / out["sb3"]["sample256_us"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds x 20k steps, fewer repeats")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args(argv)
    require("stable_baselines3", "gymnasium", "torch", benchmark="bench_integrations")
    seeds = args.seeds or (2 if args.quick else 4)
    steps = args.steps or (20_000 if args.quick else 50_000)

    with LoadMonitor() as load_buf:
        bo = buffer_only(n_add=20_000, n_sample=500, repeat=3 if args.quick else 7)
    print("buffer only (CartPole transitions, one env; ours / SB3):")
    print_table([("add (1 transition)", f"{bo['sb3']['add_us']:.2f} us", f"{bo['ours']['add_us']:.2f} us",
                  f"{bo['add_ratio']:.2f}"),
                 ("sample(256)", f"{bo['sb3']['sample256_us']:.1f} us",
                  f"{bo['ours']['sample256_us']:.1f} us", f"{bo['sample_ratio']:.2f}")],
                ("", "SB3 ReplayBuffer", "SB3ReplayBuffer", "ratio"))

    runs: dict[str, list[dict[str, float]]] = {"sb3": [], "ours": []}
    with LoadMonitor() as load_dqn:
        for seed in range(seeds):
            order = ("sb3", "ours") if seed % 2 == 0 else ("ours", "sb3")
            for name in order:
                runs[name].append(dqn_cartpole(name, seed, steps))
    rows = []
    for seed in range(seeds):
        a, b = runs["sb3"][seed], runs["ours"][seed]
        rows.append((seed, f"{a['steps_per_s']:.0f}", f"{b['steps_per_s']:.0f}",
                     f"{b['steps_per_s'] / a['steps_per_s']:.2f}",
                     f"{b['steps_per_cpu_s'] / a['steps_per_cpu_s']:.2f}", f"{a['return']:.0f}",
                     f"{b['return']:.0f}"))
    print(f"\nDQN CartPole-v1, {steps} steps per run:")
    print_table(rows, ("seed", "SB3 steps/s", "ours steps/s", "ratio", "ratio per CPU-s",
                       "SB3 return", "ours return"))
    ratios = [b["steps_per_s"] / a["steps_per_s"] for a, b in zip(runs["sb3"], runs["ours"])]
    cpu_ratios = [b["steps_per_cpu_s"] / a["steps_per_cpu_s"] for a, b in zip(runs["sb3"], runs["ours"])]
    summary = {
        "steps_per_s_ratio_median": statistics.median(ratios),
        "steps_per_cpu_s_ratio_median": statistics.median(cpu_ratios),
        "return_sb3_mean": statistics.mean(r["return"] for r in runs["sb3"]),
        "return_ours_mean": statistics.mean(r["return"] for r in runs["ours"]),
    }
    print(f"steps/s ratio (ours/SB3) median {summary['steps_per_s_ratio_median']:.2f} (per CPU-second "
          f"{summary['steps_per_cpu_s_ratio_median']:.2f}); mean final "
          f"return SB3 {summary['return_sb3_mean']:.0f}, ours {summary['return_ours_mean']:.0f}")
    path = write_results("bench_integrations", {
        "buffer_only": bo, "dqn_cartpole": {"steps": steps, "seeds": seeds, "hyperparameters": {
            k: v for k, v in DQN_CARTPOLE.items()}, "runs": runs, "summary": summary},
        "load": {"buffer_only_machine_busy": load_buf.machine_busy,
                 "dqn_machine_busy": load_dqn.machine_busy}},
        notes="ratios are ours / SB3's own ReplayBuffer, same process, same seeds")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
