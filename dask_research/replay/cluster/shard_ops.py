"""Functions that run on workers against their local shard (as tasks or via ``client.run``).

Every function takes the plane's name first and finds the shard through the worker's
:class:`~dask_research.replay.cluster.plugin.ShardPlugin`; none of them sends experience over
the network except what it returns (samples, evicted transitions, stats). They live in an
importable module so that ``dask worker`` processes can unpickle them by reference.

``client.run`` passes the worker as ``dask_worker``; as tasks they find it with
``distributed.get_worker()``.

Examples
--------
>>> from dask_research.replay.cluster import shard_ops
>>> client.run(shard_ops.info, "dqn")                           # doctest: +SKIP
{'tcp://127.0.0.1:40001': {'uid': '...', 'size': 0, ...}, ...}
>>> client.submit(shard_ops.sample, "dqn", 64, workers=[addr])  # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .plugin import local_plugin, local_shard


def ingest(plane: str, batch: Mapping[str, Any], dask_worker: Any = None) -> dict[str, Any]:
    """Ingest ``batch`` into this worker's shard; returns the shard's :meth:`info`."""
    shard = local_shard(plane, dask_worker)
    shard.ingest(batch)
    return shard.info()


def info(plane: str, dask_worker: Any = None) -> dict[str, Any]:
    """Identity, occupancy and sampling mass of this worker's shard."""
    return local_shard(plane, dask_worker).info()


def sample(plane: str, n: int, uid: str | None = None, dask_worker: Any = None) -> dict[str, Any]:
    """``n`` transitions from this worker's shard (see ``WorkerShard.sample``).

    With ``uid`` and a different shard here (the worker was replaced), returns ``None`` records
    and the new shard's info instead of sampling the wrong shard.
    """
    shard = local_shard(plane, dask_worker)
    if uid is not None and uid != shard.uid:
        return {"records": None, "keys": None, "leaf": None, "info": shard.info(), "sample_s": 0.0}
    return shard.sample(int(n))


def update_priorities(plane: str, uid: str, keys: np.ndarray, priorities: np.ndarray,
                      dask_worker: Any = None) -> int:
    """Apply priorities routed to this shard; returns how many were applied."""
    return local_shard(plane, dask_worker).update(uid, keys, priorities)


def priorities(plane: str, keys: np.ndarray, dask_worker: Any = None) -> dict[str, Any]:
    """``{"uid", "leaf"}``: the priority leaves of ``keys`` here (NaN where not stored)."""
    shard = local_shard(plane, dask_worker)
    return {"uid": shard.uid, "leaf": shard.priorities(keys)}


def stats(plane: str, dask_worker: Any = None) -> dict[str, Any]:
    """The shard's info plus the single-process plane's counters and tier occupancy."""
    shard = local_shard(plane, dask_worker)
    s = shard.plane.stats()
    s.pop("delivery", None)
    out = shard.info()
    out.update({"plane": s, "moved_in": shard.moved_in, "moved_out": shard.moved_out,
                "restored_from": shard.restored_from, "last_checkpoint": shard.last_checkpoint})
    return out


def evict_oldest(plane: str, n: int, dask_worker: Any = None) -> dict[str, Any]:
    """Remove and return the ``n`` oldest transitions of this shard (for a move)."""
    return local_shard(plane, dask_worker).evict_oldest(int(n))


def accept(plane: str, moved: Mapping[str, Any], dask_worker: Any = None) -> dict[str, Any]:
    """Ingest transitions another shard evicted; returns this shard's info."""
    shard = local_shard(plane, dask_worker)
    shard.accept(moved)
    return shard.info()


def checkpoint(plane: str, root: str | None = None, dask_worker: Any = None) -> dict[str, Any]:
    """Checkpoint this shard to ``root`` (default: the plugin's ``checkpoint_dir``)."""
    plugin = local_plugin(plane, dask_worker)
    if root is None:
        root = plugin.checkpoint_root()
    return local_shard(plane, dask_worker).checkpoint(root)


def restore(plane: str, path: str, dask_worker: Any = None) -> dict[str, Any]:
    """Load the shard checkpoint at ``path`` into this worker's (empty) shard."""
    shard = local_shard(plane, dask_worker)
    shard.restore(path)
    return shard.info()
