"""Reinforcement learning on the cluster plane: double DQN with prioritized replay.

Reusable pieces of ``examples/dqn_cartpole.py`` that Dask worker processes must import:
:mod:`~dask_research.replay.rl.actor` (vectorised-env actors that ingest into their worker's
shard) and :mod:`~dask_research.replay.rl.dqn` (the learner and the training loop). torch is
needed by the learner only; actors act with a numpy copy of the policy; gymnasium is needed by
the actors (``pip install dask-research[rl]``).

Examples
--------
>>> from dask_research.replay.rl import DQNConfig
>>> DQNConfig(max_env_steps=50_000).updates_per_step
0.5
"""
from .actor import SPEC, mlp_forward, rollout
from .dqn import DQNConfig, TrainResult, train_dqn

__all__ = ["SPEC", "rollout", "mlp_forward", "DQNConfig", "TrainResult", "train_dqn"]
