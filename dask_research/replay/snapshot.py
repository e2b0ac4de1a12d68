"""The snapshot format of an experience plane: what a checkpoint of it holds, in memory.

A snapshot is ``(meta, arrays)``: JSON-able metadata (format and version, spec, ring counters,
the sampler's class and parameters, the generator and rate-limiter state) and numpy arrays
(``field.<name>`` per field, ``sampler.leaf`` for samplers with priorities), oldest transition
first. :func:`take` copies one out of a plane, :func:`check_snapshot` refuses one a plane could
not have written, :func:`apply` loads one into a plane, :func:`sampler_for` rebuilds the
sampler a snapshot names; :func:`commit` and :func:`restore` take a plane to and from a
checkpoint directory, whose files (atomic versions, safe reads) are :mod:`.checkpoints`' job.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> from dask_research.replay import snapshot
>>> a = replay.ExperiencePlane({"x": ((), "int64")}, capacity=4,
...                            sampler=replay.PrioritizedSampler(0.6, 0.4), seed=0)
>>> _ = a.ingest({"x": np.arange(6)}, overflow="keep-newest")
>>> meta, arrays = snapshot.take(a)
>>> (meta["total"], meta["count"], arrays["field.x"].tolist(), arrays["sampler.leaf"].shape)
(6, 4, [2, 3, 4, 5], (4,))
>>> b = replay.ExperiencePlane({"x": ((), "int64")}, capacity=8,
...                            sampler=snapshot.sampler_for(meta), seed=1)
>>> snapshot.apply(b, meta, arrays)
>>> b.contents()["x"].tolist(), b.total
([2, 3, 4, 5], 6)
>>> a.close(); b.close()
"""
from __future__ import annotations

import json
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..exceptions import CheckpointError, ResearchError
from . import checkpoints
from .rate_limiter import RateLimiter
from .ring import Ring
from .samplers import BUILTIN, Sampler
from .spec import ExperienceSpec
from .storages import HostStorage, Tier, TieredStorage

__all__ = ["FORMAT", "FORMAT_VERSION", "take", "apply", "check_snapshot", "sampler_for",
           "commit", "restore"]

FORMAT = "dask-research-replay"
FORMAT_VERSION = 1


class Snapshotted(Protocol):
    """The parts of a plane a snapshot reads and writes."""

    spec: ExperienceSpec
    ring: Ring
    storage: HostStorage | TieredStorage
    sampler: Sampler
    rng: np.random.Generator
    rate_limiter: RateLimiter | None

    @property
    def lock(self) -> threading.RLock: ...


class Restorable(Snapshotted, Protocol):
    """A plane :func:`commit` saves and :func:`restore` builds and fills."""

    def snapshot(self, chunk: int = 16_384) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...

    def load_snapshot(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                      where: str = "snapshot") -> None: ...

    def close(self) -> None: ...


def take(plane: Snapshotted, chunk: int = 16_384) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A consistent copy of ``plane``: ``(meta, arrays)`` (see ``ExperiencePlane.snapshot``)."""
    chunk = max(1, int(chunk))
    ring, lock, sampler = plane.ring, plane.lock, plane.sampler
    cap = ring.capacity
    with lock:
        total0, size0 = ring.total, ring.size
        free0 = cap - size0
        sampler_meta = {k: v for k, v in sampler.state_dict().items()
                        if not isinstance(v, np.ndarray)}
        rng_state = plane.rng.bit_generator.state
        limiter = plane.rate_limiter.state_dict() if plane.rate_limiter is not None else None
    parts: list[np.ndarray] = []
    leaf_parts: list[np.ndarray] = []
    hi, lo_valid = size0, 0
    while hi > lo_valid:
        with lock:
            overwritten = max(0, (ring.total - total0) - free0)
            lo_valid = max(lo_valid, overwritten)
            lo = max(hi - chunk, lo_valid)
            if lo >= hi:
                break
            slots = ring.slots(np.arange(lo, hi, dtype=np.int64) + (total0 - size0))
            buf = plane.spec.empty(hi - lo)
            plane.storage.read_records(slots, buf)
            leaf = sampler.leaves(slots)
            if leaf is not None:
                leaf_parts.append(leaf)
        parts.append(buf)
        hi = lo
    records = np.concatenate(parts[::-1]) if parts else plane.spec.empty(0)
    n = len(records)
    meta = {
        "format": FORMAT, "version": FORMAT_VERSION, "spec": plane.spec.to_dict(),
        "capacity": cap, "total": total0, "count": n, "first_key": total0 - n,
        "sampler": {"class": type(sampler).__name__, "state": sampler_meta},
        "rng": {"bit_generator": rng_state["bit_generator"], "state": rng_state},
        "rate_limiter": limiter, "created": time.time(),
    }
    arrays = {f"field.{name}": np.ascontiguousarray(records[name]) for name in plane.spec.names}
    if sampler.prioritized:
        arrays["sampler.leaf"] = (np.concatenate(leaf_parts[::-1]) if leaf_parts
                                  else np.zeros(0))
    return json.loads(json.dumps(meta)), arrays


def spec_of(meta: Mapping[str, Any]) -> ExperienceSpec:
    """The spec a snapshot's metadata records."""
    return ExperienceSpec({k: (tuple(s), d) for k, (s, d) in meta["spec"].items()})


def check_format(meta: Mapping[str, Any], where: str) -> None:
    """Refuse metadata that is not this format, or of another version."""
    if meta.get("format") != FORMAT:
        raise CheckpointError(where, f"not a {FORMAT} checkpoint (format={meta.get('format')!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(where, f"format version {meta.get('version')!r}; this "
                                     f"dask-research reads version {FORMAT_VERSION}")


def sampler_for(meta: Mapping[str, Any], where: str = "snapshot") -> Sampler:
    """A new sampler of the built-in class and parameters ``meta`` records (see
    :meth:`~dask_research.replay.Sampler.from_state`); another class is refused."""
    info = meta["sampler"]
    klass = BUILTIN.get(info["class"])
    if klass is None:
        raise CheckpointError(where, f"sampler {info['class']!r} is not built in; "
                              "pass sampler=... to restore")
    return klass.from_state(info["state"])


def apply(plane: Snapshotted, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
          where: str = "snapshot") -> None:
    """Replace the contents of ``plane`` with a snapshot (same spec; capacity may differ)."""
    check_format(meta, where)
    spec = spec_of(meta)
    if spec != plane.spec:
        raise CheckpointError(where, f"spec {spec} differs from the plane's {plane.spec}")
    check_snapshot(plane.spec, meta, arrays, where)     # what ingest checks, and exact dtypes
    n, first = int(meta["count"]), int(meta["first_key"])      # first + n == total (checked)
    try:
        fields = {name: np.asarray(arrays[f"field.{name}"]) for name in spec.names}
    except KeyError as e:
        raise CheckpointError(where, f"array {e.args[0]!r} is missing")
    if any(len(a) != n for a in fields.values()):
        raise CheckpointError(where, f"field arrays do not all hold {n} transitions")
    ring, sampler = plane.ring, plane.sampler
    cap = ring.capacity
    if n > cap:           # restoring into a smaller plane keeps the newest
        fields = {k: v[n - cap:] for k, v in fields.items()}
        first += n - cap
        n = cap
    leaf = None
    if sampler.prioritized and "sampler.leaf" in arrays:
        leaf = np.asarray(arrays["sampler.leaf"], dtype=np.float64)[-n:] if n else np.zeros(0)
    with plane.lock:
        sampler.reset()
        info = meta["sampler"]                 # every snapshot records its sampler
        state = info["state"]
        if info["class"] == type(sampler).__name__:
            sampler.resume(state)
        ring.reset(first)
        for slot, off, m in ring.segments(n):
            plane.storage.write_fields(slot, {k: v[off:off + m] for k, v in fields.items()})
            sampler.on_insert(slot, m)
        ring.advance(n)
        if leaf is not None and n:
            sampler.load_leaves(ring.slots(np.arange(first, first + n, dtype=np.int64)), leaf)
        rng = meta.get("rng")
        if rng and rng.get("bit_generator") == plane.rng.bit_generator.state["bit_generator"]:
            plane.rng.bit_generator.state = rng["state"]
        if plane.rate_limiter is not None and meta.get("rate_limiter"):
            plane.rate_limiter.load_state_dict(meta["rate_limiter"])


def commit(plane: Restorable, path: str | os.PathLike, chunk: int = 16_384,
           extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], pathlib.Path]:
    """Write ``plane.snapshot(chunk)`` as the next committed version of checkpoint directory
    ``path``, with ``extra`` (JSON-able) as ``meta["extra"]``; returns ``(meta as written,
    version directory)``."""
    meta, arrays = plane.snapshot(chunk)
    if extra is not None:
        meta["extra"] = json.loads(json.dumps(dict(extra)))
    return meta, checkpoints.write(path, meta, arrays)


def restore(factory: Callable[..., Restorable], path: str | os.PathLike,
            tiers: Sequence[Tier] | None, sampler: Sampler | None,
            rate_limiter: RateLimiter | None, **kwargs: Any) -> Any:
    """A new plane, ``factory(spec, capacity, tiers=..., sampler=..., rate_limiter=...,
    **kwargs)``, filled from the committed checkpoint at ``path`` (the sampler is rebuilt
    from it unless given; without tiers the checkpoint's capacity is used). Whatever is wrong
    with the checkpoint raises :class:`CheckpointError` naming ``path``."""
    try:
        return _restore(factory, pathlib.Path(path), tiers, sampler, rate_limiter, **kwargs)
    except CheckpointError:
        raise
    except (ResearchError, KeyError, TypeError, ValueError, AttributeError, IndexError,
            OverflowError, EOFError, OSError, RecursionError, SyntaxError) as e:
        raise CheckpointError(str(path), f"malformed checkpoint ({type(e).__name__}: {e})") from None


def _restore(factory: Callable[..., Restorable], path: pathlib.Path,
             tiers: Sequence[Tier] | None, sampler: Sampler | None,
             rate_limiter: RateLimiter | None, **kwargs: Any) -> Any:
    meta, version = checkpoints.read_meta(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(str(path), f"not a {FORMAT} checkpoint")
    if sampler is None:
        sampler = sampler_for(meta, str(path))
    spec = spec_of(meta)
    capacity = meta.get("capacity") if tiers is None else kwargs.pop("capacity", None)
    if tiers is None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise CheckpointError(str(version), f"capacity {capacity!r} is not a positive whole number")
    plane = factory(spec, capacity, tiers=tiers, sampler=sampler, rate_limiter=rate_limiter, **kwargs)
    try:
        meta, arrays, _ = checkpoints.load(path, version)     # the same version
        plane.load_snapshot(meta, arrays, where=str(path))
    except BaseException:
        plane.close()
        raise
    return plane


def _count(meta: Mapping[str, Any], key: str, where: str) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CheckpointError(where, f"meta.json's {key!r} is {v!r}; expected a count >= 0")
    return v


def check_snapshot(spec: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                   where: str = "snapshot") -> None:
    """Refuse a snapshot whose arrays a plane of ``spec`` would not have written.

    Restores apply what ingest applies, and more strictly (a snapshot is written by a plane, so
    nothing in it needs a cast): every field array has exactly the field's dtype and the shape
    ``(count, *field shape)``; ``first_key + count == total``; priority leaves, if present, are
    ``count`` finite float64 values >= 0, and a recorded ``max_priority`` is finite and >= 0.
    Raises :class:`CheckpointError` naming ``where`` and the array. One pass over the leaves;
    the fields are checked by dtype and shape only.

    Parameters
    ----------
    spec : ExperienceSpec
        The spec of the plane restoring the snapshot.
    meta, arrays
        What :meth:`ExperiencePlane.snapshot` returned, or :func:`load` read.
    where : str
        What to name in errors (the checkpoint's path).
    """
    n = _count(meta, "count", where)
    first, total = _count(meta, "first_key", where), _count(meta, "total", where)
    if first + n != total:
        raise CheckpointError(where, f"meta.json's first_key {first} + count {n} != total {total}")
    for name, f in spec.fields.items():
        key = f"field.{name}"
        a = arrays.get(key)
        if a is None:
            raise CheckpointError(where, f"array {key!r} is missing")
        if not isinstance(a, np.ndarray):
            raise CheckpointError(where, f"array {key!r} is a {type(a).__name__}, not an array")
        want = (n, *f.shape)
        if a.dtype != f.dtype or a.shape != want:
            raise CheckpointError(where, f"array {key!r} is {a.dtype} {a.shape}; field {name!r} "
                                         f"of {n} transitions is {f.dtype} {want} (a restore "
                                         "casts nothing)")
    leaf = arrays.get("sampler.leaf")
    if leaf is not None:
        if not isinstance(leaf, np.ndarray) or leaf.dtype != np.float64 or leaf.shape != (n,):
            raise CheckpointError(where, f"array 'sampler.leaf' is "
                                         f"{getattr(leaf, 'dtype', type(leaf).__name__)} "
                                         f"{getattr(leaf, 'shape', '')}; expected float64 ({n},)")
        bad = ~(np.isfinite(leaf) & (leaf >= 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise CheckpointError(where, f"array 'sampler.leaf' holds {float(leaf[i])!r} at {i} (key "
                                         f"{first + i}); priorities are finite and >= 0")
    state = (meta.get("sampler") or {}).get("state") if isinstance(meta.get("sampler"), dict) else None
    if isinstance(state, dict) and "max_priority" in state:
        mp = state["max_priority"]
        if isinstance(mp, bool) or not isinstance(mp, (int, float)) or not (0 <= mp < float("inf")):
            raise CheckpointError(where, f"meta.json's sampler max_priority is {mp!r}; expected a "
                                         "finite number >= 0")
