"""Actors: vectorised gymnasium environments on a Dask worker, ingesting into its shard.

:func:`rollout` runs as a Dask task pinned to a worker. It keeps its environments between
calls (a per-process table keyed by run and actor id), acts epsilon-greedily with the policy
weights it is given (numpy arrays broadcast by the learner with
``client.scatter(weights, broadcast=True)``), and ingests each chunk of transitions into the
local shard (:func:`~dask_research.replay.cluster.local_shard`): no experience crosses the
network on ingest. It returns only counts and finished episode returns.

Vector environments use gymnasium's next-step autoreset: after an episode ends, the next
``step`` of that sub-environment only resets it, so that transition is not stored. ``done``
is *terminated* (the pole fell), never *truncated* (the 500-step limit): bootstrapping goes on
through a time limit.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay.rl.actor import init_mlp, mlp_forward
>>> w = init_mlp([4, 8, 2], np.random.default_rng(0))
>>> mlp_forward(w, np.zeros((3, 4), np.float32)).shape
(3, 2)
"""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

#: transitions of CartPole-style control tasks
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}

_ENVS: dict[tuple[str, int], dict[str, Any]] = {}
_ENVS_LOCK = threading.Lock()


def init_mlp(sizes: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Weights ``[W0, b0, W1, b1, ...]`` of a ReLU MLP (for doctests and numpy-only use)."""
    out = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        out += [rng.standard_normal((b, a)).astype(np.float32) / np.sqrt(a),
                np.zeros(b, np.float32)]
    return out


def mlp_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """Q-values of a ReLU MLP given torch-layout weights ``[W0 (out, in), b0, ...]``."""
    h = x
    n = len(weights) // 2
    for i in range(n):
        h = h @ weights[2 * i].T + weights[2 * i + 1]
        if i < n - 1:
            np.maximum(h, 0, out=h)
    return h


def _envs(run: str, actor: int, n_envs: int, env_id: str, seed: int) -> dict[str, Any]:
    key = (run, actor)
    with _ENVS_LOCK:
        st = _ENVS.get(key)
        if st is None:
            import gymnasium as gym

            env = gym.make_vec(env_id, num_envs=n_envs)
            obs, _ = env.reset(seed=seed)
            st = {"env": env, "obs": obs, "prev_done": np.zeros(n_envs, bool),
                  "ret": np.zeros(n_envs), "rng": np.random.default_rng(seed), "steps": 0,
                  "lock": threading.Lock(), "episodes": [], "episodes_base": 0}
            _ENVS[key] = st
        return st


def close_run(run: str) -> int:
    """Close the environments of ``run`` in this process; returns how many were closed."""
    with _ENVS_LOCK:
        keys = [k for k in _ENVS if k[0] == run]
        for k in keys:
            _ENVS.pop(k)["env"].close()
    return len(keys)


def rollout(plane: str, run: str, actor: int, weights: list[np.ndarray], epsilon: float,
            vector_steps: int, n_envs: int = 8, env_id: str = "CartPole-v1",
            seed: int = 0, seen_episodes: int | None = None) -> dict[str, Any]:
    """Step ``n_envs`` environments ``vector_steps`` times and ingest into the local shard.

    Returns ``{"actor", "worker", "env_steps", "actor_steps", "stored", "returns", "seconds"}``:
    ``env_steps`` this call's steps, ``actor_steps`` the actor's steps so far, ``returns`` the
    undiscounted returns of the episodes that ended in this call, or, with ``seen_episodes``
    (how many of this actor's episodes the caller has received), of every episode after those:
    a rollout whose result the caller never got (Dask cancelled it while it ran here) loses
    none of its episodes, and ``actor_steps`` counts its steps.
    """
    from ..cluster import local_shard

    t0 = time.perf_counter()
    shard = local_shard(plane)
    st = _envs(run, actor, n_envs, env_id, seed)
    # One rollout at a time per actor: a rollout the learner resubmitted after Dask cancelled
    # the previous one may start while that one still runs here (Dask cannot stop a running task).
    with st["lock"]:
        out = _step(shard, st, weights, epsilon, int(vector_steps), n_envs, actor, t0)
        out["returns"] = _unseen_episodes(st, out["returns"], seen_episodes)
        return out


def _unseen_episodes(st: dict[str, Any], new: list[float], seen: int | None) -> list[float]:
    """The episode returns the caller has not received: ``new`` alone without ``seen``, else all
    of the actor's after the first ``seen`` (those before are forgotten: the caller has them)."""
    kept, base = st["episodes"], st["episodes_base"]
    if seen is None:
        seen = base + len(kept)                  # everything before this call counts as received
    drop = min(max(seen - base, 0), len(kept))
    del kept[:drop]
    st["episodes_base"] = base + drop
    kept.extend(new)
    return list(kept)


def _step(shard: Any, st: dict[str, Any], weights: list[np.ndarray], epsilon: float, T: int,
          n_envs: int, actor: int, t0: float) -> dict[str, Any]:
    env, rng = st["env"], st["rng"]
    obs, prev_done, ret = st["obs"], st["prev_done"], st["ret"]
    o_buf = np.empty((T, n_envs, 4), np.float32)
    n_buf = np.empty((T, n_envs, 4), np.float32)
    a_buf = np.empty((T, n_envs), np.int64)
    r_buf = np.empty((T, n_envs), np.float32)
    d_buf = np.empty((T, n_envs), bool)
    keep = np.empty((T, n_envs), bool)
    returns: list[float] = []
    for t in range(T):
        greedy = mlp_forward(weights, obs.astype(np.float32)).argmax(1)
        explore = rng.random(n_envs) < epsilon
        act = np.where(explore, rng.integers(0, 2, n_envs), greedy)
        nobs, rew, term, trunc, _ = env.step(act)
        o_buf[t], n_buf[t], a_buf[t], r_buf[t], d_buf[t] = obs, nobs, act, rew, term
        keep[t] = ~prev_done                     # a reset step: not a transition
        ret += np.where(prev_done, 0.0, rew)
        done = term | trunc
        for i in np.flatnonzero(done & ~prev_done):
            returns.append(float(ret[i]))
            ret[i] = 0.0
        prev_done = done
        obs = nobs
    st["obs"], st["prev_done"], st["ret"] = obs, prev_done, ret
    m = keep.reshape(-1)
    batch = {"obs": o_buf.reshape(-1, 4)[m], "action": a_buf.reshape(-1)[m],
             "reward": r_buf.reshape(-1)[m], "next_obs": n_buf.reshape(-1, 4)[m],
             "done": d_buf.reshape(-1)[m]}
    stored = shard.ingest(batch) if m.any() else 0
    st["steps"] += T * n_envs
    return {"actor": actor, "worker": shard.address, "env_steps": T * n_envs, "actor_steps": st["steps"],
            "stored": stored, "returns": returns, "seconds": time.perf_counter() - t0}
