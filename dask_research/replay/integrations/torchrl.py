"""TorchRL and TensorDict: TensorDicts in and out of a plane, and the plane inside TorchRL.

- :func:`from_tensordict` / :func:`ingest_tensordict`: a (nested) ``TensorDict`` becomes a
  plane batch: nested keys are joined with ``"."`` (``("next", "reward")`` -> field
  ``"next.reward"``), tensors are viewed as numpy on the CPU.
- :func:`to_tensordict`: a delivered :class:`~dask_research.replay.Batch` becomes a
  ``TensorDict`` of batch size ``[B]`` with the nested keys restored, plus ``"index"`` (the
  batch's keys, int64) and, for prioritized batches, ``"priority_weight"`` (TorchRL's names).
- :func:`tensordict_batches`: ``plane.batches(...)`` delivering TensorDicts (the conversion runs
  in the caller's thread, after the prefetched numpy batch arrives).
- :class:`PlaneStorage` and :class:`PlaneSampler`: a storage/sampler pair that
  ``torchrl.data.ReplayBuffer(storage=..., sampler=...)`` (and ``TensorDictReplayBuffer``)
  accept, so a TorchRL training loop keeps its buffer calls (``extend``, ``sample``,
  ``update_priority``, ``len``, ``empty``, ``dumps``/``loads``) on the plane's storage and
  samplers. :func:`plane_replay_buffer` builds the whole buffer.

The pair uses the plane's own index space: the sampler returns transition *keys* (insertion
numbers), the storage reads keys, and ``update_priority`` passes keys to
``plane.update_priorities``, so a priority for a transition overwritten since it was sampled is
dropped instead of landing on its successor. The writer's slot indices (what
``ReplayBuffer.extend`` returns) are TorchRL's round-robin positions; ask the plane for keys
(``rb.sample(return_info=True)[1]["index"]``) instead. Only round-robin writers are
supported: the plane appends in ring order.

Examples
--------
>>> import torch
>>> from tensordict import TensorDict
>>> from dask_research import replay
>>> from dask_research.replay.integrations.torchrl import plane_replay_buffer
>>> plane = replay.ExperiencePlane({"obs": ((4,), "float32"), "next.reward": ((1,), "float32")},
...                                capacity=100, seed=0)
>>> rb = plane_replay_buffer(plane, batch_size=8)
>>> _ = rb.extend(TensorDict({"obs": torch.ones(10, 4), "next": {"reward": torch.zeros(10, 1)}},
...                          batch_size=[10]))
>>> td = rb.sample()
>>> len(rb), td["next", "reward"].shape, td["index"].dtype
(10, torch.Size([8, 1]), torch.int64)
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.samplers import Sampler as _TRLSampler
from torchrl.data.replay_buffers.storages import Storage as _TRLStorage

from ...durable import Files, schema
from ...exceptions import CheckpointError, InputError
from ..batch import Batch
from ..experience_plane import ExperiencePlane

__all__ = ["from_tensordict", "to_tensordict", "ingest_tensordict", "tensordict_batches",
           "TensorDictBatches", "PlaneStorage", "PlaneSampler", "plane_replay_buffer"]

from .tensordict import (  # noqa: F401
    _TORCHRL_KEYS,
    SEP,
    TensorDictBatches,
    from_tensordict,
    ingest_tensordict,
    tensordict_batches,
    to_tensordict,
)

#: where :meth:`PlaneStorage.dumps` keeps the writer's next slot, beside the plane's checkpoint
WRITER_FILE = "writer.json"
#: the most bytes ``writer.json`` may have (its writer refuses more, its reader reads no more)
WRITER_CAP = 4096


def _identity(x: Any) -> Any:
    return x


class PlaneStorage(_TRLStorage):
    """A ``torchrl.data`` storage over an :class:`~dask_research.replay.ExperiencePlane`.

    ``set`` (from TorchRL's round-robin writer) ingests into the plane; ``get`` reads keys (what
    :class:`PlaneSampler` returns); ``len`` is the plane's size. ``state_dict`` / ``dumps`` hold
    the plane's snapshot (no pickle).
    """

    def __init__(self, plane: ExperiencePlane, device: Any = None):
        if not isinstance(plane, ExperiencePlane):
            raise InputError("plane", plane, "an ExperiencePlane (a ClusterPlane's shards cannot be "
                             "read by key from the learner)", where="PlaneStorage")
        super().__init__(max_size=plane.capacity)
        self.plane = plane
        self.out_device = device
        self._next = 0                 # the writer slot the next write must start at
        self._stash: tuple[torch.Tensor, TensorDict] | None = None

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        if not set_cursor:
            raise InputError("set_cursor", False, "True: the plane appends in ring order and "
                             "cannot overwrite a slot in place", where="PlaneStorage.set")
        slots = torch.as_tensor(cursor).reshape(-1).cpu().numpy()
        want = (self._next + np.arange(len(slots))) % self.max_size
        if not np.array_equal(slots, want):
            raise InputError("cursor", slots[:4].tolist(), f"consecutive slots from {self._next} "
                             "(a RoundRobinWriter); other writers reorder the ring, which the plane "
                             "does not", where="PlaneStorage.set")
        if isinstance(cursor, int) or (isinstance(cursor, torch.Tensor) and cursor.ndim == 0):
            data = _unsqueeze(data)
        # more rows than the ring holds: keep the newest, as TorchRL's own storages do
        self.plane.ingest(from_tensordict(data), overflow="keep-newest")
        self._next = int((self._next + len(slots)) % self.max_size)
        self._set_last_cursor(cursor)
        self._bump_mutation_revision()

    def get(self, index: Any) -> TensorDict:
        stash = self._stash
        if stash is not None and stash[0] is index:
            self._stash = None
            return stash[1]
        keys = torch.as_tensor(index).reshape(-1).cpu().numpy().astype(np.int64)
        rec, valid = self.plane.gather_keys(keys)
        if not valid.all():
            raise InputError("index", keys[~valid][:4].tolist(), f"keys of stored transitions "
                             f"[{self.plane.total - len(self.plane)}, {self.plane.total})",
                             where="PlaneStorage.get")
        return to_tensordict(Batch({n: rec[n] for n in self.plane.spec.names}, keys),
                             self.out_device)

    def __len__(self) -> int:
        return len(self.plane)

    def contains(self, item: Any) -> Any:
        keys = torch.as_tensor(item)
        total, size = self.plane.total, len(self.plane)
        return (keys >= total - size) & (keys < total)

    def state_dict(self) -> dict[str, Any]:
        meta, arrays = self.plane.snapshot()
        return {"meta": json.dumps(meta), "arrays": {k: torch.from_numpy(v) for k, v in arrays.items()},
                "next": self._next}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
                  for k, v in state_dict["arrays"].items()}
        self.plane.load_snapshot(json.loads(state_dict["meta"]), arrays, where="PlaneStorage")
        self._next = int(state_dict.get("next", self.plane.cursor))
        self._bump_mutation_revision()

    def _empty(self) -> None:
        """Drop every transition; keys go on counting (a late priority update stays stale)."""
        meta, arrays = self.plane.snapshot()
        meta = dict(meta, count=0, first_key=meta["total"])
        self.plane.load_snapshot(meta, {k: v[:0] for k, v in arrays.items()}, where="PlaneStorage")
        self._next = 0
        self._stash = None
        self._bump_mutation_revision()

    def dumps(self, path: Any) -> None:
        """Checkpoint the plane into ``path/plane`` (this plane is then that directory's one
        writer until it is closed) and replace ``path/plane/writer.json`` (the writer's next slot)."""
        root = pathlib.Path(path) / "plane"
        self.plane.checkpoint(root)
        self.plane.checkpoint_writer(root).write_json(WRITER_FILE, {"next": self._next}, cap=WRITER_CAP)

    def loads(self, path: Any) -> None:
        """Load what :meth:`dumps` wrote; a checkpoint or a ``writer.json`` that is not one is a
        :class:`~dask_research.exceptions.CheckpointError` naming the file."""
        root = pathlib.Path(path) / "plane"
        files = Files(root, error=CheckpointError)
        doc = files.read_json(files.join(WRITER_FILE), cap=WRITER_CAP)
        try:
            nxt = schema.check(doc, schema.Obj({"next": schema.Int(0, self.max_size - 1)}))["next"]
        except schema.Invalid as e:
            raise files.fail(files.join(WRITER_FILE), f"{e}; refused") from None
        restored = ExperiencePlane.restore(root, sampler=type(self.plane.sampler)())
        try:
            meta, arrays = restored.snapshot()
        finally:
            restored.close()
        self.plane.load_snapshot(meta, arrays, where=str(root))
        self._next = nxt
        self._bump_mutation_revision()

    def __repr__(self) -> str:
        return f"PlaneStorage({self.plane!r})"


def _unsqueeze(data: Any) -> Any:
    if isinstance(data, TensorDictBase):
        return data.unsqueeze(0)
    return {k: (v[None] if hasattr(v, "shape") else np.asarray(v)[None]) for k, v in data.items()}


class PlaneSampler(_TRLSampler):
    """A ``torchrl.data`` sampler drawing with the plane's own sampler (uniform, prioritized,
    recent), for a :class:`PlaneStorage`. Indices are keys; prioritized batches carry
    ``info["priority_weight"]``; ``update_priority`` goes to ``plane.update_priorities``."""

    def __init__(self) -> None:
        self._plane: ExperiencePlane | None = None

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        if not isinstance(storage, PlaneStorage):
            raise InputError("storage", type(storage).__name__, "a PlaneStorage (PlaneSampler draws "
                             "with the plane's sampler)", where="PlaneSampler.sample")
        self._plane = storage.plane
        b = storage.plane.sample(int(batch_size))
        td = to_tensordict(b, storage.out_device)
        index = td["index"]
        storage._stash = (index, td)
        info: dict[str, Any] = {}
        if b.weights is not None:
            info["priority_weight"] = td["priority_weight"]
        return index, info

    def update_priority(self, index: Any, priority: Any, *, storage: Any = None) -> None:
        plane = storage.plane if isinstance(storage, PlaneStorage) else self._plane
        if plane is None:
            raise InputError("storage", storage, "the PlaneStorage the indices came from",
                             where="PlaneSampler.update_priority")
        plane.update_priorities(index, priority)

    @property
    def default_priority(self) -> float:
        s = self._plane.sampler if self._plane is not None else None
        return float(getattr(s, "max_priority", 1.0))

    def state_dict(self) -> dict[str, Any]:
        return {}                       # the sampler's state lives in the plane (its snapshot)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def _empty(self) -> None:
        return None

    def dumps(self, path: Any) -> None:
        return None

    def loads(self, path: Any) -> None:
        return None


def plane_replay_buffer(plane: ExperiencePlane, batch_size: int | None = None, device: Any = None,
                        tensordict: bool = False, **kwargs: Any) -> Any:
    """``torchrl.data.ReplayBuffer`` (or ``TensorDictReplayBuffer``) on ``plane``.

    Storage :class:`PlaneStorage`, sampler :class:`PlaneSampler`, TorchRL's round-robin writer,
    and no collate step (the storage returns TensorDicts). ``kwargs`` go to TorchRL
    (``transform``, ``prefetch``, ...).
    """
    from torchrl.data import ReplayBuffer, TensorDictReplayBuffer

    cls = TensorDictReplayBuffer if tensordict else ReplayBuffer
    kwargs.setdefault("collate_fn", _identity)
    return cls(storage=PlaneStorage(plane, device), sampler=PlaneSampler(), batch_size=batch_size,
               **kwargs)
