"""RLlib (new API stack): an experience plane as DQN's episode replay buffer (experimental).

:class:`PlaneEpisodeReplayBuffer` is an RLlib ``EpisodeReplayBuffer`` whose transitions live
in a local :class:`~dask_research.replay.ExperiencePlane`. RLlib's DQN takes it by its dotted
name (RLlib tests the *name* for ``"EpisodeReplayBuffer"``, so a class object is refused):

.. code-block:: python

    config = DQNConfig().environment("CartPole-v1").training(replay_buffer_config={
        "type": "dask_research.replay.integrations.rllib.PlaneEpisodeReplayBuffer",
        "capacity": 50_000})

``add`` takes RLlib's ``SingleAgentEpisode`` chunks and stores their 1-step transitions
(``obs``, ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``: only the last
step of a finished chunk carries its episode's flags); ``sample(..., sample_episodes=True)``
returns the 1-step episodes RLlib's DQN learner expects, with ``n_step`` and ``weights`` in
``extra_model_outputs``, drawn by the plane's sampler.

Limits (each refused with an ``InputError`` that says so): ``n_step`` other than 1 (the plane
stores transitions, not episodes, so an n-step return would need each episode's neighbours,
which chunks of several environments interleave), sequence sampling (``batch_length_T > 0``,
stateful modules), multi-agent episodes. Prioritized replay is not wired: RLlib sends TD
errors only to subclasses of its ``PrioritizedEpisodeReplayBuffer``. Checkpointing a running
algorithm (``get_state`` / ``set_state``) carries the plane's snapshot.

``pip install "dask-research[rllib]"`` brings ``ray[rllib]`` (2.60 here; it pins
``gymnasium==1.2.2``, which the project's other RL paths accept), and the README's test command
installs it, so this buffer and one DQN run on CartPole are tested there.

Examples
--------
>>> import numpy as np
>>> from ray.rllib.env.single_agent_episode import SingleAgentEpisode
>>> chunk = SingleAgentEpisode(observations=[np.full(4, t, np.float32) for t in range(4)],
...                            actions=[0, 1, 0], rewards=[1.0, 1.0, 1.0], terminated=True,
...                            len_lookback_buffer=0)
>>> buffer = PlaneEpisodeReplayBuffer(capacity=1_000, seed=0)
>>> buffer.add(chunk)
>>> len(buffer), len(buffer.sample(num_items=8, n_step=1, sample_episodes=True))
(3, 8)
"""
from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

from ...exceptions import InputError
from ..experience_plane import ExperiencePlane
from ..samplers import Sampler

__all__ = ["PlaneEpisodeReplayBuffer"]


class PlaneEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's episode replay buffer interface over an :class:`ExperiencePlane`.

    Parameters
    ----------
    capacity : int
        Transitions kept (RLlib's ``capacity``: timesteps).
    sampler : Sampler, optional
        The plane's sampler (default uniform).
    seed : int, optional
        Seed of the plane's sampling generator.
    **kwargs
        RLlib's (``batch_size_B``, ``batch_length_T``, ``metrics_num_episodes_for_smoothing``).
    """

    def __init__(self, capacity: int = 10_000, *, sampler: Sampler | None = None,
                 seed: int | None = None, **kwargs: Any):
        super().__init__(capacity=capacity, **kwargs)
        self._sampler = sampler
        self._seed = seed
        self.plane: ExperiencePlane | None = None
        self._last_keys: np.ndarray | None = None

    def _ensure_plane(self, obs: np.ndarray, act: np.ndarray) -> ExperiencePlane:
        if self.plane is None:
            o, a = obs[0], act[0]
            spec = {"obs": (o.shape, o.dtype.str), "next_obs": (o.shape, o.dtype.str),
                    "action": (a.shape, a.dtype.str), "reward": ((), "float32"),
                    "terminated": ((), "bool"), "truncated": ((), "bool")}
            self.plane = ExperiencePlane(spec, capacity=int(self.capacity), sampler=self._sampler,
                                         seed=self._seed)
        return self.plane

    # RLlib's own ReplayBufferInterface.add(batch, **kwargs) and EpisodeReplayBuffer.add(episodes)
    # disagree, so no signature satisfies both; this one takes what EpisodeReplayBuffer's callers pass.
    def add(self, episodes: Any) -> None:  # type: ignore[override, unused-ignore]
        """Store the transitions of RLlib ``SingleAgentEpisode`` chunks."""
        if isinstance(episodes, SingleAgentEpisode):
            episodes = [episodes]
        for ep in episodes:
            if not isinstance(ep, SingleAgentEpisode):
                raise InputError("episodes", type(ep).__name__, "SingleAgentEpisode chunks "
                                 "(multi-agent episodes are not supported)",
                                 where="PlaneEpisodeReplayBuffer.add")
            n = len(ep)
            if n == 0:
                continue
            obs = np.asarray(ep.get_observations(slice(0, n + 1)))
            act = np.asarray(ep.get_actions(slice(0, n)))
            plane = self._ensure_plane(obs, act)
            term = np.zeros(n, bool)
            trunc = np.zeros(n, bool)
            term[-1], trunc[-1] = bool(ep.is_terminated), bool(ep.is_truncated)
            plane.ingest({"obs": obs[:-1], "next_obs": obs[1:], "action": act,
                          "reward": np.asarray(ep.get_rewards(slice(0, n)), np.float32),
                          "terminated": term, "truncated": trunc})
            self._num_timesteps_added += n
        self._num_timesteps = len(self.plane) if self.plane is not None else 0

    def __len__(self) -> int:
        return 0 if self.plane is None else len(self.plane)

    def get_num_timesteps(self, module_id: Any = None) -> int:
        return len(self)

    def sample(self, num_items: int | None = None, *, batch_size_B: int | None = None,
               batch_length_T: int | None = None, n_step: Any = None, beta: float = 0.0,
               gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, sample_episodes: bool | None = False,
               to_numpy: bool = False, lookback: int = 0, min_batch_length_T: int = 0,
               **kwargs: Any) -> Any:
        """``num_items`` 1-step episodes drawn by the plane's sampler (RLlib's DQN call): a list
        of ``SingleAgentEpisode``."""
        from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

        where = "PlaneEpisodeReplayBuffer.sample"
        if n_step not in (None, 1):
            raise InputError("n_step", n_step, "1 (n-step returns over a plane of transitions "
                             "are not supported)", where=where)
        if batch_length_T:
            raise InputError("batch_length_T", batch_length_T, "0 (sequence sampling for "
                             "stateful modules is not supported)", where=where)
        if not sample_episodes:
            raise InputError("sample_episodes", sample_episodes, "True (RLlib's new API stack)",
                             where=where)
        if self.plane is None:
            from ..experience_plane import EmptyPlaneError

            raise EmptyPlaneError()
        B = int(num_items or batch_size_B or self.batch_size_B)
        b = self.plane.sample(B)
        self._last_keys = b.indices
        w = np.ones(B) if b.weights is None else np.asarray(b.weights, dtype=np.float64)
        out = []
        for i in range(B):
            ep = SingleAgentEpisode(
                observations=[b["obs"][i], b["next_obs"][i]], actions=[b["action"][i]],
                rewards=[float(b["reward"][i])], terminated=bool(b["terminated"][i]),
                truncated=bool(b["truncated"][i]), len_lookback_buffer=0, t_started=0)
            ep.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(np.full((1,), 1), lookback=0)
            ep.extra_model_outputs["weights"] = InfiniteLookbackBuffer(w[i:i + 1], lookback=0)
            if to_numpy:
                ep.to_numpy()
            out.append(ep)
        self.sampled_timesteps += B
        return out

    def get_state(self) -> dict[str, Any]:
        """Picklable state: the plane's snapshot (no locks, no threads)."""
        snap = None if self.plane is None else self.plane.snapshot()
        return {"capacity": self.capacity, "snapshot": snap,
                "added": self._num_timesteps_added, "sampled": self.sampled_timesteps}

    def set_state(self, state: dict[str, Any]) -> None:
        self._num_timesteps_added = state.get("added", 0)
        self.sampled_timesteps = state.get("sampled", 0)
        if state.get("snapshot") is None:
            return
        meta, arrays = state["snapshot"]
        if self.plane is None:
            spec = meta["spec"]
            self.plane = ExperiencePlane({k: (tuple(s), d) for k, (s, d) in spec.items()},
                                         capacity=int(self.capacity), sampler=self._sampler,
                                         seed=self._seed)
        self.plane.load_snapshot(meta, arrays, where="PlaneEpisodeReplayBuffer.set_state")
        self._num_timesteps = len(self.plane)
