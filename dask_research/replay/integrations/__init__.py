"""The experience plane as the replay buffer of RL frameworks (docs/integrations.rst).

Each integration is a submodule behind its extra, imported only when used, so importing
``dask_research.replay`` never imports torch, Stable-Baselines3, TorchRL or Ray:

- :mod:`~dask_research.replay.integrations.sb3` (extra ``sb3``): :class:`SB3ReplayBuffer`, a
  ``replay_buffer_class`` for SB3's DQN, SAC, TD3, DDPG.
- :mod:`~dask_research.replay.integrations.torchrl` (extra ``torchrl``): ``TensorDict`` in and
  out, and a storage/sampler pair for ``torchrl.data.ReplayBuffer``.
- :mod:`~dask_research.replay.integrations.rllib` (``ray[rllib]``, no extra: it pins an older
  gymnasium): ``PlaneEpisodeReplayBuffer`` for RLlib's DQN on the new API stack (experimental).

Examples
--------
>>> import stable_baselines3                         # the sb3 extra
>>> from dask_research.replay import integrations
>>> integrations.SB3ReplayBuffer.__module__      # imports SB3 only now
'dask_research.replay.integrations.sb3'
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> (submodule, extra that installs its framework)
_LAZY = {
    "SB3ReplayBuffer": ("sb3", "sb3"),
    "sb3_spec": ("sb3", "sb3"),
    "PrioritizedDQN": ("sb3", "sb3"),
    "to_tensordict": ("torchrl", "torchrl"),
    "ingest_tensordict": ("torchrl", "torchrl"),
    "tensordict_batches": ("torchrl", "torchrl"),
    "from_tensordict": ("torchrl", "torchrl"),
    "TensorDictBatches": ("torchrl", "torchrl"),
    "PlaneStorage": ("torchrl", "torchrl"),
    "PlaneSampler": ("torchrl", "torchrl"),
    "plane_replay_buffer": ("torchrl", "torchrl"),
    "PlaneEpisodeReplayBuffer": ("rllib", "ray[rllib]"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in ("sb3", "torchrl", "rllib"):
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    sub, extra = _LAZY[name]
    try:
        mod = importlib.import_module(f"{__name__}.{sub}")
    except ImportError as e:
        raise ImportError(f"dask_research.replay.integrations.{name} needs the {extra!r} extra "
                          f"(pip install 'dask-research[{extra}]'): {e}") from e
    return getattr(mod, name)


def __dir__() -> list[str]:
    return sorted([*__all__, "sb3", "torchrl", "rllib"])
