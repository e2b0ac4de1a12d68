"""Double DQN with prioritized replay through a :class:`~dask_research.replay.ClusterPlane`.

The learner runs in the client process (torch, CPU by default); actors run as Dask tasks on
the workers (:func:`~dask_research.replay.rl.actor.rollout`), each pinned to one worker, and
ingest into that worker's shard. The loop:

1. keep one rollout task in flight per actor; when one finishes, record its episode returns
   and submit the next with the newest policy weights (re-broadcast with
   ``client.scatter(weights, broadcast=True)`` every ``broadcast_every`` updates) and the
   current epsilon;
2. do ``updates_per_step`` learner updates per environment step collected (after
   ``learning_starts``): a prefetched batch from ``plane.batches()``, the double-DQN target
   ``r + gamma * (1 - done) * Q_target(s', argmax_a Q(s', a))``, a Huber loss weighted by the
   importance weights, and new priorities ``|td error|`` routed back to the owning shards;
3. copy the online network to the target network every ``target_update`` updates;
4. stop when the mean return of the last ``window`` episodes reaches ``target_return`` or
   after ``max_env_steps``.

A rollout that Dask cancels (a lost dependency, an operator's ``client.cancel``) is logged and
submitted again with freshly broadcast weights (the steps and episodes it made before Dask
dropped it still count: the next rollout of its actor reports them); a lost scheduler, or 32
cancellations of one actor's rollouts in a row, stops the run with one line. A worker that
leaves the cluster takes its actors with it (one line); with none left the run stops.

Everything is seeded (torch, the plane's allocation draws, each shard, each actor's
environments and exploration); the interleaving of actors and learner is not, so two runs
differ slightly.

Examples
--------
>>> from dask_research.replay.rl import DQNConfig, train_dqn
>>> result = train_dqn(client, DQNConfig(target_return=475))     # doctest: +SKIP
>>> result.solved_at_env_steps, result.final_mean_return         # doctest: +SKIP
"""
from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ... import replay
from ..._cluster import workers_info
from ..._compat import SCHEDULER_LOST, cancellation_of, client_status
from ...exceptions import ResearchError
from .actor import SPEC, close_run, rollout

logger = logging.getLogger(__name__)


@dataclass
class DQNConfig:
    """Hyperparameters; the defaults reached a mean return of 475 over 20 episodes on
    CartPole-v1 after 66k environment steps (2 workers x 1 actor x 8 envs, seed 0)."""

    env_id: str = "CartPole-v1"
    actors_per_worker: int = 1
    n_envs: int = 8                   # vectorised environments per actor
    vector_steps: int = 32            # steps of the vector env per rollout task
    max_env_steps: int = 120_000
    target_return: float = 475.0
    window: int = 20                  # episodes averaged for target_return
    learning_starts: int = 1_000
    updates_per_step: float = 0.5
    batch_size: int = 64
    hidden: int = 256
    lr: float = 1e-3
    lr_final: float | None = 1e-4     # linear decay to this by max_env_steps (None: constant)
    gamma: float = 0.99
    target_update: int = 200          # updates between target-network copies
    eps_start: float = 1.0
    eps_final: float = 0.01
    explore_steps: int = 16_000       # linear epsilon decay over this many env steps
    alpha: float = 0.6
    beta_start: float = 0.4           # annealed to 1 over max_env_steps
    priority_eps: float = 1e-3
    grad_clip: float = 10.0
    buffer_per_worker: int = 50_000
    broadcast_every: int = 20         # updates between weight broadcasts
    prefetch: int = 4
    seed: int = 0
    torch_threads: int = 1
    max_seconds: float | None = None

    @property
    def n_actions(self) -> int:
        return 2


@dataclass
class TrainResult:
    """What a training run did: returns per episode, when it solved, speeds, plane stats."""

    returns: list[float]
    env_steps: int
    updates: int
    seconds: float
    solved: bool
    solved_at_env_steps: int | None
    final_mean_return: float
    best_mean_return: float
    env_steps_per_s: float
    updates_per_s: float
    curve: list[tuple[int, float]] = field(default_factory=list)   # (env steps, mean return)
    plane_stats: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        s = (f"{self.env_steps:,} env steps, {self.updates:,} updates in {self.seconds:.1f} s "
             f"({self.env_steps_per_s:,.0f} steps/s, {self.updates_per_s:,.0f} updates/s); "
             f"mean return of the last episodes {self.final_mean_return:.1f}")
        if self.solved:
            s += f"; reached the target at {self.solved_at_env_steps:,} env steps"
        return s


def _qnet(torch: Any, hidden: int, n_actions: int) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_actions))


def _weights(net: Any) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in net.parameters()]


def _close_actors(client: Any, run: str) -> None:
    """Close the environments ``run``'s actors keep on the workers (each worker's table of them)."""
    try:
        client.run(close_run, run)
    except Exception as e:  # noqa: BLE001 - a worker gone, a cluster closing: nothing left to close there
        logger.debug("could not close the environments of %s on every worker: %s", run, e)


#: Cancelled rollouts of one actor resubmitted in a row, with none of its rollouts finishing
#: between, before the run gives up: Dask keeps cancelling what it is given.
MAX_CANCELLED_IN_A_ROW = 32


def _resubmittable(client: Any, future: Any, in_a_row: int) -> None:
    """Check that a rollout ``future`` Dask cancelled can be submitted again; else raise.

    The run stops with one line when the client lost its scheduler, or after
    :data:`MAX_CANCELLED_IN_A_ROW` cancellations of one actor's rollouts with none finishing between.
    """
    exc = cancellation_of(future)
    reason = getattr(exc, "reason", None) or "not given"
    if client_status(client) != "running" or reason == SCHEDULER_LOST:
        raise ResearchError(f"DQN training stopped: the client lost its scheduler (rollout "
                            f"{future.key} cancelled, reason: {reason})")
    if in_a_row + 1 >= MAX_CANCELLED_IN_A_ROW:
        raise ResearchError(f"DQN training stopped: Dask cancelled {in_a_row + 1} rollouts of one actor in a "
                            f"row (last: {future.key}, reason: {reason}); check the workers' logs")
    logger.warning("rollout %s was cancelled by Dask (reason: %s); submitting it again with "
                   "freshly broadcast weights", future.key, reason)


def _drop_lost_actors(client: Any, addr_of: dict[int, str], running: dict[int, Any], idle: list[int]) -> None:
    """Stop waiting for the actors of workers that left the cluster (their rollouts are pinned
    there, and their replay shard went with them): training goes on with the others, said in
    one line; with none left it stops in one line."""
    try:
        live = set(workers_info(client))
    except Exception as e:  # noqa: BLE001 - the scheduler is gone: its cancellations stop the run
        logger.debug("could not ask the scheduler for its workers: %s", e)
        return
    gone = sorted({addr for i, addr in addr_of.items() if addr not in live and (i in running or i in idle)})
    if not gone:
        return
    for i, addr in addr_of.items():
        if addr in gone:
            f = running.pop(i, None)
            if f is not None:
                f.cancel()
            if i in idle:
                idle.remove(i)
    if not running and not idle:
        raise ResearchError(f"DQN training stopped: the workers of every actor left the cluster "
                            f"(last: {', '.join(gone)})")
    logger.warning("worker(s) %s left the cluster: their actors stop; training goes on with %d actors",
                   ", ".join(gone), len(running) + len(idle))


def train_dqn(client: Any, cfg: DQNConfig | None = None,
              progress: Callable[[dict[str, Any]], None] | None = None,
              plane_kwargs: dict[str, Any] | None = None) -> TrainResult:
    """Train double DQN with prioritized replay; actors on ``client``'s workers.

    ``progress`` (optional) is called after every finished rollout with a dict of counters.
    """
    import torch
    import torch.nn.functional as F

    cfg = cfg or DQNConfig()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.torch_threads)
    q = _qnet(torch, cfg.hidden, cfg.n_actions)
    q_target = _qnet(torch, cfg.hidden, cfg.n_actions)
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    sampler = replay.PrioritizedSampler(alpha=cfg.alpha, beta=cfg.beta_start)
    run = f"dqn-{uuid.uuid4().hex[:8]}"
    plane = replay.ClusterPlane(SPEC, client=client, capacity_per_worker=cfg.buffer_per_worker,
                                sampler=sampler, name=run, seed=cfg.seed, **(plane_kwargs or {}))
    workers = sorted(workers_info(client))
    actors = [(i, workers[i % len(workers)]) for i in range(cfg.actors_per_worker * len(workers))]

    def epsilon(steps: int) -> float:
        f = min(1.0, steps / cfg.explore_steps)
        return cfg.eps_start + f * (cfg.eps_final - cfg.eps_start)

    def submit(i: int, addr: str, weights_f: Any, steps: int) -> Any:
        return client.submit(rollout, plane.name, run, i, weights_f, epsilon(steps),
                             cfg.vector_steps, cfg.n_envs, cfg.env_id,
                             cfg.seed * 1000 + 17 * i, episodes_seen[i], workers=[addr],
                             allow_other_workers=False, pure=False,
                             key=f"rollout-{run}-{i}-{uuid.uuid4().hex[:8]}")

    # What the learner has received of each actor: its steps and episodes (a rollout Dask
    # cancelled while it ran still stepped; the next one's result counts what it did).
    steps_seen = {i: 0 for i, _ in actors}
    episodes_seen = {i: 0 for i, _ in actors}
    cancelled = {i: 0 for i, _ in actors}      # each actor's cancelled rollouts in a row
    t0 = time.perf_counter()
    weights_f = client.scatter(_weights(q), broadcast=True, hash=False)
    running = {i: submit(i, addr, weights_f, 0) for i, addr in actors}
    addr_of = dict(actors)
    idle: list[int] = []
    chunk = cfg.n_envs * cfg.vector_steps
    slack = len(actors) * chunk
    env_steps = updates = 0
    checked_workers = time.monotonic()
    returns: list[float] = []
    curve: list[tuple[int, float]] = []
    solved_at = None
    best = -math.inf
    it = None
    last_broadcast = 0
    try:
        while True:
            # --- actors: collect finished rollouts, resubmit with the newest weights -------
            finished = [i for i, f in running.items() if f.done()]
            for i in finished:
                if running[i].status == "cancelled":
                    # Dask dropped the rollout (a lost dependency, most likely its weights): run
                    # it again with freshly broadcast weights; a lost scheduler ends the run.
                    _resubmittable(client, running.pop(i), cancelled[i])
                    cancelled[i] += 1
                    idle.append(i)
                    last_broadcast = -cfg.broadcast_every
                    continue
                out = running[i].result()
                env_steps += out["actor_steps"] - steps_seen[i]
                steps_seen[i] = out["actor_steps"]
                episodes_seen[i] += len(out["returns"])
                returns.extend(out["returns"])
                if len(returns) >= cfg.window:
                    m = float(np.mean(returns[-cfg.window:]))
                    best = max(best, m)
                    curve.append((env_steps, m))
                    if solved_at is None and m >= cfg.target_return:
                        solved_at = env_steps
                del running[i]
                idle.append(i)
                cancelled[i] = 0
                if progress is not None:
                    progress({"env_steps": env_steps, "updates": updates, "episodes": len(returns),
                              "mean_return": curve[-1][1] if curve else float("nan"),
                              "epsilon": epsilon(env_steps)})
            if time.monotonic() - checked_workers > 1.0:
                checked_workers = time.monotonic()
                _drop_lost_actors(client, addr_of, running, idle)
            # actors stay at most one chunk each ahead of the learner (samples per insert)
            allowed = cfg.learning_starts + updates / cfg.updates_per_step + slack
            while idle and env_steps + chunk * len(running) < allowed:
                if updates - last_broadcast >= cfg.broadcast_every:
                    weights_f = client.scatter(_weights(q), broadcast=True, hash=False)
                    last_broadcast = updates
                i = idle.pop(0)
                running[i] = submit(i, addr_of[i], weights_f, env_steps)
            if solved_at is not None or env_steps >= cfg.max_env_steps or (
                    cfg.max_seconds is not None and time.perf_counter() - t0 > cfg.max_seconds):
                break
            # --- learner: updates in proportion to the environment steps ------------------
            due = int((env_steps - cfg.learning_starts) * cfg.updates_per_step) - updates
            if due <= 0:
                if not running and idle:
                    continue
                time.sleep(0.001)
                continue
            if it is None:
                plane.refresh()
                it = plane.batches(batch_size=cfg.batch_size, prefetch=cfg.prefetch, to="torch")
            for _ in range(min(due, 64)):
                b = next(it)
                frac = min(1.0, env_steps / cfg.max_env_steps)
                sampler.beta = cfg.beta_start + frac * (1.0 - cfg.beta_start)
                if cfg.lr_final is not None:
                    for g in opt.param_groups:
                        g["lr"] = cfg.lr + frac * (cfg.lr_final - cfg.lr)
                obs, nobs = b.obs, b.next_obs
                with torch.no_grad():
                    a_star = q(nobs).argmax(1, keepdim=True)
                    target = b.reward + cfg.gamma * (~b.done).float() * \
                        q_target(nobs).gather(1, a_star).squeeze(1)
                pred = q(obs).gather(1, b.action.unsqueeze(1)).squeeze(1)
                td = pred - target
                loss = (b.weights * F.smooth_l1_loss(pred, target, reduction="none")).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(q.parameters(), cfg.grad_clip)
                opt.step()
                plane.update_priorities(b.indices, td.detach().abs().numpy() + cfg.priority_eps)
                updates += 1
                if updates % cfg.target_update == 0:
                    q_target.load_state_dict(q.state_dict())
                if (updates & 7) == 0 and any(f.done() for f in running.values()):
                    break
        seconds = time.perf_counter() - t0
        if it is not None:
            it.close()
        plane.flush()
        stats = plane.stats()
    finally:
        if it is not None:
            it.close()
        for f in running.values():
            f.cancel()
        if client_status(client) == "running":   # a lost scheduler: no one to ask
            _close_actors(client, run)
        plane.close(drop=True)
    final = float(np.mean(returns[-cfg.window:])) if returns else float("nan")
    return TrainResult(returns=returns, env_steps=env_steps, updates=updates, seconds=seconds,
                       solved=solved_at is not None, solved_at_env_steps=solved_at,
                       final_mean_return=final, best_mean_return=best,
                       env_steps_per_s=env_steps / seconds, updates_per_s=updates / seconds,
                       curve=curve, plane_stats=stats, config=asdict(cfg))
