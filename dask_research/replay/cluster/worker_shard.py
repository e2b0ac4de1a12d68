"""One worker's shard of a cluster plane: a single-process plane plus identity and moves.

A :class:`WorkerShard` wraps an :class:`~dask_research.replay.ExperiencePlane` (the same
storages, samplers and non-pickle checkpoint format) and adds what the cluster needs: a random
``uid`` (a new shard on the same address is a different shard), sampling that returns the raw
priority leaves so that the learner can weigh samples across shards, updates that check the
uid and the insertion key, and eviction of the oldest transitions for rebalancing.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import UniformSampler
>>> from dask_research.replay.cluster.worker_shard import WorkerShard
>>> shard = WorkerShard("p", {"x": ((2,), "float32")}, capacity=100, sampler=UniformSampler(),
...                     seed=0)
>>> shard.ingest({"x": np.ones((10, 2))})
10
>>> out = shard.sample(4)
>>> out["records"].shape, bool(out["keys"].min() >= 0)
((4,), True)
>>> shard.close()
"""
from __future__ import annotations

import copy
import pathlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...exceptions import InputError, ResearchError
from .. import snapshot
from ..experience_plane import ExperiencePlane
from ..samplers import Sampler
from ..spec import ExperienceSpec
from ..storages import Tier


class ShardMissingError(ResearchError, LookupError):
    """A worker holds no shard of the named plane (its plugin is not registered there)."""

    def __init__(self, plane: str, worker: str):
        self.plane = plane
        self.worker = worker
        super().__init__(plane, worker)

    def __str__(self) -> str:
        return (f"worker {self.worker} holds no shard of plane {self.plane!r}; create the plane "
                f"with replay.ClusterPlane(spec, client=client, name={self.plane!r}) first (it "
                "registers the ShardPlugin on every worker)")


def checkpoint_info(meta: Mapping[str, Any], path: str | pathlib.Path,
                    version: str | pathlib.Path) -> dict[str, Any]:
    """What a committed shard checkpoint holds, from its metadata: ``uid``, ``address``,
    ``path``, ``version``, ``size`` (transitions saved), ``inserted`` and ``time``."""
    shard = (meta.get("extra") or {}).get("shard") or {}
    return {"uid": shard.get("uid"), "address": shard.get("address"), "path": str(path),
            "version": pathlib.Path(version).name, "size": int(meta["count"]),
            "inserted": int(meta["total"]), "time": float(meta.get("created", 0.0))}


class ShardsLostError(ResearchError, LookupError):
    """Every shard of a cluster plane is lost (its worker left): nothing is left to sample.

    Attributes: ``plane`` (name), ``shards`` (one dict per lost shard: ``id``, ``worker``,
    ``reason``, ``size`` (transitions it held), ``checkpointed`` (transitions in its last
    checkpoint)), ``transitions`` and ``checkpointed`` (their sums).
    """

    def __init__(self, plane: str, shards: list[dict[str, Any]]):
        self.plane = plane
        self.shards = shards
        self.transitions = sum(int(s["size"]) for s in shards)
        self.checkpointed = sum(int(s["checkpointed"]) for s in shards)
        super().__init__(plane, shards)

    def __str__(self) -> str:
        shown = ", ".join(f"shard {s['id']} on {s['worker']} ({s['reason']}, {s['size']:,} "
                          "transitions)" for s in self.shards[:8])
        if len(self.shards) > 8:
            shown += f" and {len(self.shards) - 8} more"
        return (f"replay plane {self.plane!r}: every shard is lost: {shown}; {self.transitions:,} "
                f"transitions lost, {self.checkpointed:,} of them in checkpoints; start workers "
                "(a checkpointed shard is restored onto a new one with restore='auto', or by "
                "plane.restore_lost) and ingest again")


class WorkerShard:
    """The part of a cluster plane that lives on one worker.

    Parameters
    ----------
    name : str
        The plane's name.
    spec : ExperienceSpec or mapping
    capacity : int
        Transitions this shard keeps (ignored when ``tiers`` give a capacity).
    sampler : Sampler
        Copied, so one instance can configure many shards.
    tiers : list of Tier, optional
    seed : int, optional
    address : str
        The worker's address (for reports).
    """

    def __init__(self, name: str, spec: ExperienceSpec | Mapping[str, Any], capacity: int | None,
                 sampler: Sampler, tiers: Sequence[Tier] | None = None, seed: int | None = None,
                 address: str = ""):
        self.name = name
        self.uid = uuid.uuid4().hex
        self.address = address
        self.plane = ExperiencePlane(spec, capacity, tiers=tiers, sampler=copy.deepcopy(sampler),
                                     seed=seed)
        self.spec = self.plane.spec
        self.moved_in = 0
        self.moved_out = 0
        self.restored_from: str | None = None
        self.last_checkpoint: dict[str, Any] | None = None

    # --- ingest --------------------------------------------------------------------------
    def ingest(self, batch: Mapping[str, Any], priorities: np.ndarray | None = None) -> int:
        """Add transitions; with ``priorities``, set them instead of the maximum priority."""
        p = self.plane
        n = p.ingest(batch)
        if priorities is not None and p.sampler.prioritized and n:
            pr = np.asarray(priorities, dtype=np.float64).reshape(-1)[-min(n, p.capacity):]
            p.update_priorities(p.ring.newest(len(pr)), pr)
        return n

    # --- sampling ------------------------------------------------------------------------
    def mass(self) -> float:
        """Sampling mass: the sum of priority leaves (prioritized) or the number stored."""
        return self.plane.sampler.mass(self.plane.size)

    def info(self) -> dict[str, Any]:
        """Identity, occupancy and sampling mass (small; sent with every sample reply)."""
        p = self.plane
        with p.lock:
            return {"uid": self.uid, "address": self.address, "size": p.size,
                    "capacity": p.capacity, "inserted": p.total, "mass": self.mass(),
                    "min_leaf": p.sampler.min_leaf() if p.size else float("nan"),
                    "time": time.time()}

    def sample(self, n: int) -> dict[str, Any]:
        """``n`` transitions: ``records`` (structured array), ``keys``, ``leaf`` (priority^alpha
        of each, prioritized only), ``info`` and ``sample_s`` (time spent here)."""
        t0 = time.perf_counter()
        rec, keys, _, leaf = self.plane.draw(int(n), leaves=True)
        return {"records": rec, "keys": keys, "leaf": leaf, "info": self.info(),
                "sample_s": time.perf_counter() - t0}

    def update(self, uid: str, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Apply priorities if ``uid`` is this shard's; stale keys are dropped by the plane."""
        if uid != self.uid:
            return 0
        return self.plane.update_priorities(keys, priorities)

    def priorities(self, keys: np.ndarray) -> np.ndarray:
        """Current priority leaves of ``keys`` (NaN for keys no longer stored); for tests."""
        p = self.plane
        keys = np.asarray(keys, dtype=np.int64)
        with p.lock:
            valid = p.ring.valid(keys)
            leaf = p.sampler.leaves(p.ring.slots(keys))
            return np.where(valid, 1.0 if leaf is None else leaf, np.nan)

    # --- rebalancing ---------------------------------------------------------------------
    def evict_oldest(self, n: int) -> dict[str, Any]:
        """Remove the ``n`` oldest transitions and return them (fields and priorities)."""
        p = self.plane
        if n < 0:
            raise InputError("n", n, "a non-negative count", where="WorkerShard.evict_oldest")
        with p.lock:
            slots, _ = p.ring.evict_oldest(n)
            n = len(slots)
            rec = p.spec.empty(n)
            p.storage.read_records(slots, rec)
            pr = p.sampler.priorities(slots)
            p.sampler.clear(slots)
            self.moved_out += n
        return {"fields": {k: np.ascontiguousarray(rec[k]) for k in p.spec.names},
                "priorities": pr, "n": n}

    def accept(self, moved: Mapping[str, Any]) -> int:
        """Ingest what :meth:`evict_oldest` of another shard returned."""
        if not moved["n"]:
            return 0
        n = self.ingest(moved["fields"], moved["priorities"])
        self.moved_in += n
        return n

    # --- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, root: str | pathlib.Path) -> dict[str, Any]:
        """Commit this shard to ``root/<uid>/`` (the single-process plane's format, one atomic
        step); returns what the committed files hold (``size`` and ``inserted`` as saved, not
        the live counts, which ingest may have moved on meanwhile).

        The first checkpoint into a directory makes this shard its one writer (it holds the
        directory's lease) until :meth:`close`; another live writer there is refused with a
        :class:`~dask_research.exceptions.CheckpointError` naming it."""
        path = pathlib.Path(root) / self.uid
        t0 = time.perf_counter()
        meta, version = snapshot.commit(
            self.plane, path, extra={"shard": {"uid": self.uid, "address": self.address}})
        out = checkpoint_info(meta, path, version)
        out["seconds"] = time.perf_counter() - t0
        self.last_checkpoint = out
        return out

    def restore(self, path: str | pathlib.Path) -> int:
        """Load the committed shard checkpoint at ``path`` into this (empty) shard; returns
        the transitions restored."""
        path = pathlib.Path(path)
        if self.plane.size:
            raise InputError("shard", f"{self.plane.size} transitions", "an empty shard to "
                             "restore into", where="WorkerShard.restore")
        meta, arrays, version = snapshot.read(path)       # validated before any array is read
        self.plane.load_snapshot(meta, arrays, where=str(version))
        self.restored_from = str(path)
        return self.plane.size

    def close(self) -> None:
        """Close the shard's plane (and so release the checkpoint directories it writes)."""
        self.plane.close()

    def __repr__(self) -> str:
        return (f"WorkerShard({self.name!r}, uid={self.uid[:8]}, size={self.plane.size:,}/"
                f"{self.plane.capacity:,})")
