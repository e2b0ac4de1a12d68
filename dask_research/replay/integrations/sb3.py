"""Stable-Baselines3: an experience plane as the replay buffer of DQN, SAC, TD3 (and DDPG).

:class:`SB3ReplayBuffer` is a subclass of SB3's own ``ReplayBuffer`` that SB3's off-policy
algorithms take as ``replay_buffer_class``, with SB3's usual ``replay_buffer_kwargs``
(``handle_timeout_termination``) plus the plane's (``sampler``, ``seed``, ``client``,
``plane``, ``flush_every``). It keeps SB3's semantics exactly:

- ``add(obs, next_obs, action, reward, done, infos)`` with ``n_envs`` transitions per call;
  ``pos``, ``full``, ``size()`` and ``buffer_size`` count rows of ``n_envs`` transitions as SB3
  does, and the ring holds ``(buffer_size // n_envs) * n_envs`` transitions.
- ``sample(batch_size, env=None)`` returns SB3's ``ReplayBufferSamples`` with SB3's shapes,
  dtypes and device: observations ``(B, *obs_shape)`` in the observation space's dtype, actions
  ``(B, action_dim)`` (float64 actions as float32), next observations, dones and rewards
  ``(B, 1)`` float32; ``env`` (a ``VecNormalize``) normalizes observations and rewards.
- ``handle_timeout_termination``: a transition whose ``infos[i]["TimeLimit.truncated"]`` is
  true is stored with ``truncated = 1`` and comes out with ``dones = 0`` (SB3 bootstraps
  through time limits). Both flags are kept: the plane's fields are ``done`` (SB3's flag:
  terminated or truncated) and ``truncated``; ``terminated = done * (1 - truncated)``.
- Picklable (``model.save_replay_buffer`` / ``load_replay_buffer``): the pickled state is the
  plane's snapshot (numpy arrays and JSON-able meta, no locks or threads); unpickling rebuilds
  a local plane, sampler state and sampling generator included.

Adding one transition writes into small preallocated columns (as SB3's own buffer does);
every ``flush_every`` rows, and before anything reads the plane (``sample``, pickling, the
``plane`` attribute), the staged rows go to the plane in one ingest (:meth:`flush`), so
sampling always sees every added transition.

Prioritized replay: pass ``sampler=PrioritizedSampler(alpha, beta)``. SB3's algorithms neither
use importance weights nor report TD errors, so ``sample`` keeps the batch's keys in
``last_indices`` and its weights (a ``(B, 1)`` float32 tensor) in ``last_weights``; a training
loop that wants prioritized replay calls ``update_priorities(buffer.last_indices, td_errors)``.
:class:`PrioritizedDQN` is SB3's DQN doing so: importance-weighted Huber loss, new priorities
``|TD error| + eps`` after each gradient step.

Examples
--------
>>> from stable_baselines3 import DQN
>>> from dask_research.replay.integrations.sb3 import SB3ReplayBuffer
>>> model = DQN("MlpPolicy", "CartPole-v1", buffer_size=1_000, learning_starts=50,
...             replay_buffer_class=SB3ReplayBuffer, replay_buffer_kwargs={"seed": 0}, seed=0)
>>> _ = model.learn(200)
>>> model.replay_buffer.size(), len(model.replay_buffer.plane)
(200, 200)
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from ...exceptions import InputError, ResearchError
from ..experience_plane import ExperiencePlane
from ..samplers import Sampler

__all__ = ["SB3ReplayBuffer", "PrioritizedDQN", "sb3_spec"]

#: default rows (of ``n_envs`` transitions) staged before one ingest into the plane
FLUSH_EVERY = 64


def sb3_spec(observation_space: spaces.Space, action_space: spaces.Space) -> dict[str, Any]:
    """The plane spec SB3's ``ReplayBuffer`` would store for these spaces.

    ``{"obs", "next_obs", "action", "reward", "done", "truncated"}``: observations in the
    observation space's shape and dtype, actions ``(action_dim,)`` (float64 stored as float32,
    as SB3 does), the three scalars float32. Use it to build a ``ClusterPlane`` to pass as
    ``plane=``.
    """
    from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape

    if isinstance(observation_space, spaces.Dict):
        raise InputError("observation_space", type(observation_space).__name__,
                         "a Box, Discrete, MultiDiscrete or MultiBinary space (Dict observation "
                         "spaces need SB3's DictReplayBuffer)", where="SB3ReplayBuffer")
    shape = get_obs_shape(observation_space)
    assert isinstance(shape, tuple)             # a Dict space, the one with a dict of shapes, is refused above
    obs_shape = tuple(shape)
    obs_dtype = np.dtype(observation_space.dtype)
    act_dtype = np.dtype(ReplayBuffer._maybe_cast_dtype(action_space.dtype))
    return {"obs": (obs_shape, obs_dtype.str), "next_obs": (obs_shape, obs_dtype.str),
            "action": ((get_action_dim(action_space),), act_dtype.str),
            "reward": ((), "float32"), "done": ((), "float32"), "truncated": ((), "float32")}


def _seed_from_numpy_global() -> int:
    """A seed that is a function of numpy's global generator state; the state is not advanced."""
    st = np.random.get_state()
    assert isinstance(st, tuple)                # the legacy form, numpy's default: (name, keys, pos, ...)
    return int((st[1].astype(np.uint64).sum() + np.uint64(st[2])) % np.uint64(2**31 - 1))


class SB3ReplayBuffer(ReplayBuffer):
    """SB3's replay buffer backed by an :class:`~dask_research.replay.ExperiencePlane`.

    Parameters
    ----------
    buffer_size, observation_space, action_space, device, n_envs
        As SB3's ``ReplayBuffer`` (SB3 passes them).
    optimize_memory_usage : bool
        Must be False: the plane stores ``next_obs`` with each transition, so there is no
        memory to save by sharing it, and SB3's variant cannot keep ``handle_timeout_termination``.
    handle_timeout_termination : bool
        As SB3: ``infos[i]["TimeLimit.truncated"]`` marks a time limit, whose ``dones`` come
        out as 0.
    sampler : Sampler, optional
        The plane's sampler (default uniform); e.g. ``PrioritizedSampler(0.6, 0.4)``.
    seed : int, optional
        Seed of the plane's sampling generator. Default: derived from the state of numpy's
        global generator (which SB3 seeds with the algorithm's ``seed``) without drawing from
        it, so runs are reproducible and SB3's own random stream is left as it was.
    client : distributed.Client, optional
        Put the plane on the Dask cluster of ``client`` (a
        :class:`~dask_research.replay.ClusterPlane` whose shards together hold at least the
        ring's capacity) instead of this process.
    plane : ExperiencePlane or ClusterPlane, optional
        Use this plane (its spec must be :func:`sb3_spec` of the spaces); ``reset`` then needs
        a local plane.
    flush_every : int
        Rows staged in this process before one ingest into the plane (at most the ring's rows).
    sb3_sampling : bool
        Draw batches exactly as SB3's own buffer does (rows, then envs, uniformly from numpy's
        global generator) and read them from the plane by key: with the same seed, training
        is then bit-for-bit the same as with SB3's buffer. Needs a local plane; the plane's
        sampler is not used. Default False: the plane's sampler and generator draw.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1,
                 optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                 sampler: Sampler | None = None, seed: int | None = None, client: Any = None,
                 plane: Any = None, flush_every: int = FLUSH_EVERY, sb3_sampling: bool = False,
                 n_steps: int = 1, **unknown: Any):
        if n_steps != 1:          # SB3's NStepReplayBuffer's argument, passed through by SB3
            raise InputError("n_steps", n_steps, "1: n-step returns are not provided by "
                             "SB3ReplayBuffer (its samples are 1-step, discounts=None). For "
                             "n-step DQN use SB3's own NStepReplayBuffer (replay_buffer_class="
                             "NStepReplayBuffer), or read the plane through "
                             "dask_research.replay.NStepReturn(n, gamma)", where="SB3ReplayBuffer")
        if unknown:
            name = next(iter(unknown))
            raise InputError(name, unknown[name], "one of SB3ReplayBuffer's arguments (sampler, "
                             "seed, client, plane, flush_every, sb3_sampling)",
                             where="SB3ReplayBuffer")
        if optimize_memory_usage:
            raise InputError("optimize_memory_usage", True, "False (the plane stores next_obs "
                             "with every transition; pass optimize_memory_usage=False to the "
                             "algorithm)", where="SB3ReplayBuffer")
        if not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise InputError("n_envs", n_envs, "a positive integer", where="SB3ReplayBuffer")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise InputError("sampler", sampler, "a Sampler (UniformSampler(), "
                             "PrioritizedSampler(alpha, beta), RecentSampler(window))",
                             where="SB3ReplayBuffer")
        if sb3_sampling and (client is not None or sampler is not None):
            raise InputError("sb3_sampling", True, "False with client= or sampler= (SB3's draw is "
                             "uniform and reads a local plane by key)", where="SB3ReplayBuffer")
        if client is not None and plane is not None:
            raise InputError("client", client, "None when plane= is given (one or the other)",
                             where="SB3ReplayBuffer")
        # SB3's BaseBuffer: spaces, obs_shape, action_dim, pos, full, device, n_envs. Not
        # ReplayBuffer.__init__, which would allocate SB3's own arrays.
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device,
                                           n_envs=int(n_envs))
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.spec = sb3_spec(observation_space, action_space)
        self.capacity = self.buffer_size * self.n_envs
        if not isinstance(flush_every, (int, np.integer)) or flush_every < 1:
            raise InputError("flush_every", flush_every, "a positive number of rows",
                             where="SB3ReplayBuffer")
        self.flush_every = min(int(flush_every), self.buffer_size)
        self._sampler_proto = copy.deepcopy(sampler)     # unattached: what reset/unpickle build
        self._seed = _seed_from_numpy_global() if seed is None else int(seed)
        self.sb3_sampling = bool(sb3_sampling)
        self._discrete_obs = isinstance(observation_space, spaces.Discrete)
        self.last_indices: np.ndarray | None = None
        self.last_weights: th.Tensor | None = None
        if plane is not None:
            self._check_plane(plane)
            self._plane = plane
        elif client is not None:
            self._plane = self._cluster_plane(client)
        else:
            self._plane = self._local_plane()
        self._alloc_staging()

    # --- planes --------------------------------------------------------------------------
    def _local_plane(self) -> ExperiencePlane:
        sampler = copy.deepcopy(self._sampler_proto)
        return ExperiencePlane(self.spec, capacity=self.capacity, sampler=sampler, seed=self._seed)

    def _cluster_plane(self, client: Any) -> Any:
        from ..cluster import ClusterPlane

        n = max(len(client.scheduler_info(n_workers=-1)["workers"]), 1)
        return ClusterPlane(self.spec, client=client, capacity_per_worker=math.ceil(self.capacity / n),
                            sampler=copy.deepcopy(self._sampler_proto), seed=self._seed)

    def _check_plane(self, plane: Any) -> None:
        from ..spec import ExperienceSpec

        if ExperienceSpec(self.spec) != getattr(plane, "spec", None):
            raise InputError("plane", plane, f"a plane with the spec sb3_spec(observation_space, "
                             f"action_space) = {ExperienceSpec(self.spec)}", where="SB3ReplayBuffer")

    @property
    def plane(self) -> Any:
        """The plane behind the buffer; reading it first hands it the staged transitions."""
        self.flush()
        return self._plane

    @property
    def is_local(self) -> bool:
        """Whether the plane lives in this process (an :class:`ExperiencePlane`)."""
        return isinstance(self._plane, ExperiencePlane)

    def _alloc_staging(self) -> None:
        rows, e = self.flush_every, self.n_envs
        self._stage = {name: np.zeros((rows, e, *shape), dtype=dtype)
                       for name, (shape, dtype) in self.spec.items()}
        s = self._stage
        self._s_obs, self._s_next = s["obs"], s["next_obs"]
        self._s_act, self._s_rew = s["action"], s["reward"]
        self._s_done, self._s_trunc = s["done"], s["truncated"]
        self._staged = 0
        self._rows_total = getattr(self, "_rows_total", 0)

    # --- SB3 interface -------------------------------------------------------------------
    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Add one step of ``n_envs`` transitions (SB3's signature and semantics)."""
        i = self._staged
        if self._discrete_obs:
            obs = np.reshape(obs, (self.n_envs, *self.obs_shape))
            next_obs = np.reshape(next_obs, (self.n_envs, *self.obs_shape))
        self._s_obs[i] = obs
        self._s_next[i] = next_obs
        self._s_act[i] = np.reshape(action, (self.n_envs, self.action_dim))
        self._s_rew[i] = reward
        self._s_done[i] = done
        if self.handle_timeout_termination:
            self._s_trunc[i] = [info.get("TimeLimit.truncated", False) for info in infos]
        else:
            self._s_trunc[i] = 0.0
        self._staged = i + 1
        if self._staged == self.flush_every:
            self.flush()
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def flush(self) -> int:
        """Hand the staged rows to the plane (one ingest); returns the transitions handed."""
        k = self._staged
        if k == 0:
            return 0
        m = k * self.n_envs
        batch = {name: a[:k].reshape(m, *a.shape[2:]) for name, a in self._stage.items()}
        self._plane.ingest(batch)
        self._staged = 0
        self._rows_total += k
        return m

    def sample(self, batch_size: int, env: Any = None) -> ReplayBufferSamples:
        """A batch as SB3's ``ReplayBufferSamples`` (SB3's shapes, dtypes, device).

        ``env`` (a ``VecNormalize``) normalizes observations and rewards as SB3 does. With a
        prioritized sampler, ``last_indices`` / ``last_weights`` hold the batch's keys and
        importance weights.
        """
        if self.sb3_sampling:
            if not self.is_local:
                raise ResearchError("sb3_sampling reads a local plane by key; this buffer's plane "
                                    f"is {type(self._plane).__name__}")
            upper = self.buffer_size if self.full else self.pos
            return self._get_samples(np.random.randint(0, upper, size=int(batch_size)), env)
        self.flush()
        b = self._plane.sample(int(batch_size))
        return self._to_samples(b, env)

    def _to_samples(self, b: Any, env: Any) -> ReplayBufferSamples:
        self.last_indices = b.indices
        w = b.weights
        self.last_weights = (None if w is None
                             else self.to_torch(np.asarray(w, dtype=np.float32).reshape(-1, 1)))
        dones = (b["done"] * (1.0 - b["truncated"])).reshape(-1, 1)
        data = (self._normalize_obs(b["obs"], env), b["action"],
                self._normalize_obs(b["next_obs"], env), dones,
                self._normalize_reward(b["reward"].reshape(-1, 1), env))
        return ReplayBufferSamples(*(self.to_torch(np.ascontiguousarray(a)) for a in data))

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> ReplayBufferSamples:
        """SB3's hook: rows ``batch_inds`` (each from a random env), read from the plane.

        For subclasses written against SB3's ``ReplayBuffer`` that choose their own indices.
        Needs a local plane (``ExperiencePlane.gather_keys``).
        """
        if not self.is_local:
            raise ResearchError("SB3ReplayBuffer._get_samples reads rows by index, which needs a "
                                "local ExperiencePlane; use sample() with a ClusterPlane")
        self.flush()
        rows_total = self._rows_total
        if self._plane.total != rows_total * self.n_envs:
            raise ResearchError(f"SB3ReplayBuffer._get_samples maps rows to keys of transitions this "
                                f"buffer added ({rows_total * self.n_envs}), but the plane holds "
                                f"{self._plane.total} insertions; use sample() on a shared plane")
        rows = np.asarray(batch_inds, dtype=np.int64)
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(rows),))
        latest = (rows_total - 1) - ((rows_total - 1 - rows) % self.buffer_size)
        keys = latest * self.n_envs + env_indices
        rec, valid = self._plane.gather_keys(keys)
        if not valid.all():
            raise InputError("batch_inds", rows[~valid][:5].tolist(),
                             f"rows in [0, {self.size()}) (rows that hold transitions)",
                             where="SB3ReplayBuffer._get_samples")
        from ..batch import Batch

        return self._to_samples(Batch({n: rec[n] for n in self.spec}, keys), env)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """New priorities for the keys ``indices`` (e.g. ``last_indices``); see the module doc."""
        return self._plane.update_priorities(indices, priorities)

    def reset(self) -> None:
        """Empty the buffer (a fresh local plane, same sampler and seed)."""
        if not self.is_local:
            raise ResearchError("SB3ReplayBuffer.reset empties a local plane only; a ClusterPlane's "
                                "shards live on the workers: build a new buffer (or plane) instead")
        self._plane.close()
        self._plane = self._local_plane()
        self._staged = 0
        self._rows_total = 0
        super(ReplayBuffer, self).reset()

    def close(self) -> None:
        """Stage nothing more and release the plane."""
        self.flush()
        self._plane.close()

    # --- pickling (save_replay_buffer / load_replay_buffer) --------------------------------
    def __getstate__(self) -> dict[str, Any]:
        if not self.is_local:
            raise ResearchError("an SB3ReplayBuffer on a ClusterPlane cannot be pickled (its shards "
                                "live on the Dask workers); checkpoint it with "
                                "buffer.plane.checkpoint(root) instead of save_replay_buffer")
        self.flush()
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_plane", "_stage") and not k.startswith("_s_")}
        meta, arrays = self._plane.snapshot()
        state["_snapshot"] = (meta, arrays)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        meta, arrays = state.pop("_snapshot")
        self.__dict__.update(state)
        self._plane = self._local_plane()
        self._plane.load_snapshot(meta, arrays, where="SB3ReplayBuffer (unpickled)")
        self._alloc_staging()

    def __repr__(self) -> str:
        return (f"SB3ReplayBuffer(buffer_size={self.buffer_size}, n_envs={self.n_envs}, "
                f"size={self.size()}, plane={self._plane!r})")


def _prioritized_dqn_class() -> type:
    from stable_baselines3 import DQN
    from torch.nn import functional as F

    from ..samplers import PrioritizedSampler

    class PrioritizedDQN(DQN):
        """SB3's DQN with prioritized replay on an :class:`SB3ReplayBuffer` (Schaul et al. 2016).

        Takes DQN's arguments. Unless ``replay_buffer_class`` is given, the buffer is an
        :class:`SB3ReplayBuffer` with ``PrioritizedSampler(alpha, beta)``; ``priority_eps`` is
        added to ``|TD error|``. ``train`` is DQN's, with the Huber loss weighted by the batch's
        importance weights and the TD errors sent back as priorities.
        """

        def __init__(self, *args: Any, alpha: float = 0.6, beta: float = 0.4,
                     priority_eps: float = 1e-6, **kwargs: Any):
            if kwargs.get("replay_buffer_class") is None:
                kwargs["replay_buffer_class"] = SB3ReplayBuffer
                rbk = dict(kwargs.get("replay_buffer_kwargs") or {})
                rbk.setdefault("sampler", PrioritizedSampler(alpha=alpha, beta=beta))
                kwargs["replay_buffer_kwargs"] = rbk
            self.priority_eps = float(priority_eps)
            super().__init__(*args, **kwargs)

        def train(self, gradient_steps: int, batch_size: int = 100) -> None:
            rb = self.replay_buffer
            if not isinstance(rb, SB3ReplayBuffer):
                raise InputError("replay_buffer_class", type(rb).__name__, "SB3ReplayBuffer "
                                 "(PrioritizedDQN sends priorities to its plane)",
                                 where="PrioritizedDQN")
            self.policy.set_training_mode(True)
            self._update_learning_rate(self.policy.optimizer)
            losses = []
            for _ in range(gradient_steps):
                data = rb.sample(batch_size, env=self._vec_normalize_env)
                keys, weights = rb.last_indices, rb.last_weights
                discounts = data.discounts if data.discounts is not None else self.gamma
                with th.no_grad():
                    next_q, _ = self.q_net_target(data.next_observations).max(dim=1)
                    target = data.rewards + (1 - data.dones) * discounts * next_q.reshape(-1, 1)
                current = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
                per = F.smooth_l1_loss(current, target, reduction="none")
                loss = (per * weights).mean() if weights is not None else per.mean()
                losses.append(loss.item())
                self.policy.optimizer.zero_grad()
                loss.backward()
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
                td = (current - target).detach().abs().reshape(-1).cpu().numpy()
                rb.update_priorities(keys, td + self.priority_eps)
            self._n_updates += gradient_steps
            self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
            self.logger.record("train/loss", np.mean(losses))

    PrioritizedDQN.__module__ = __name__
    return PrioritizedDQN


PrioritizedDQN = _prioritized_dqn_class()
