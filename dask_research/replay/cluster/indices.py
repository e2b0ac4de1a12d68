"""Global transition indices of a cluster plane: shard id, insertion key and ring slot.

A delivered batch's ``indices`` are int64 numbers that say where each transition came from:
the high 15 bits hold the *shard id* (assigned by the learner-side
:class:`~dask_research.replay.ClusterPlane`, one per worker shard it ever saw, never reused),
the low 48 bits the transition's *insertion key* in that shard. The ring slot follows from the
key (``key % capacity``), and the key tells a shard whether the transition is still the one in
that slot, so a priority update that arrives after the slot was overwritten is dropped, and an
update for a shard that died (or was replaced by a new one on the same address) is dropped too.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay.cluster.indices import encode, decode
>>> idx = encode(3, np.array([0, 7, 2**40]))
>>> decode(idx)[0].tolist(), decode(idx)[1].tolist()
([3, 3, 3], [0, 7, 1099511627776])
"""
from __future__ import annotations

import numpy as np

from ...exceptions import InputError

KEY_BITS = 48
MAX_SHARDS = 1 << (63 - KEY_BITS)      # 32768 shard ids per plane
_KEY_MASK = (1 << KEY_BITS) - 1


def encode(shard_id: int, keys: np.ndarray) -> np.ndarray:
    """Global indices of ``keys`` (insertion numbers) of shard ``shard_id``."""
    if not 0 <= int(shard_id) < MAX_SHARDS:
        raise InputError("shard_id", shard_id, f"an integer in [0, {MAX_SHARDS})", where="indices")
    keys = np.asarray(keys, dtype=np.int64)
    return (np.int64(shard_id) << np.int64(KEY_BITS)) | keys


def decode(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard_ids, keys)`` of global ``indices``."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    return idx >> np.int64(KEY_BITS), idx & np.int64(_KEY_MASK)


def slots(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Ring slots of insertion ``keys`` in a shard of ``capacity`` transitions."""
    return np.asarray(keys, dtype=np.int64) % int(capacity)
