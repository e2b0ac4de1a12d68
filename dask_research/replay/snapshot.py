"""The snapshot format of an experience plane: what a checkpoint of it holds, in memory.

A snapshot is ``(meta, arrays)``: JSON-able metadata (format and version, spec, ring counters,
the sampler's class and parameters, the generator and rate-limiter state) and numpy arrays
(``field.<name>`` per field, ``sampler.leaf`` for samplers with priorities), oldest transition
first. :func:`take` copies one out of a plane, :func:`check_meta` and :func:`check_snapshot`
refuse one a plane could not have written (metadata against a :mod:`~dask_research.durable.schema`:
types, ranges, finiteness; arrays against the spec), :func:`apply` loads one into a plane,
:func:`sampler_for` rebuilds the sampler a snapshot names; :func:`commit`, :func:`read` and
:func:`restore` take a plane to and from a checkpoint directory, whose files (one writer,
atomic versions, bounded reads) are :mod:`.checkpoints`' job. A checkpoint's metadata is
validated before anything uses it, and its ``data.npz`` must hold exactly the arrays the
validated metadata implies (:func:`expected_arrays`) before any of them is read.

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

from ..durable import jsondoc, schema
from ..exceptions import CheckpointError, InputError, ResearchError
from . import checkpoints
from .rate_limiter import RateLimiter
from .ring import MAX_KEYS, Ring
from .samplers import BUILTIN, Sampler
from .samplers._sumtree import MAX_LEAF
from .spec import ExperienceSpec
from .storages import HostStorage, Tier, TieredStorage

__all__ = ["FORMAT", "FORMAT_VERSION", "take", "apply", "check_meta", "check_snapshot",
           "expected_arrays", "sampler_for", "commit", "read", "restore"]

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

    def checkpoint_writer(self, path: str | os.PathLike[str]) -> checkpoints.Writer: ...

    def load_snapshot(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                      where: str = "snapshot") -> None: ...

    def close(self) -> None: ...


def _check_open(plane: Any) -> None:
    if getattr(plane, "closed", False):
        from .source import PlaneClosedError

        raise PlaneClosedError(getattr(plane, "name", "?"), "snapshot")


def take(plane: Snapshotted, chunk: int = 16_384) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A consistent copy of ``plane``: ``(meta, arrays)`` (see ``ExperiencePlane.snapshot``)."""
    chunk = max(1, int(chunk))
    ring, lock, sampler = plane.ring, plane.lock, plane.sampler
    cap = ring.capacity
    with lock:
        _check_open(plane)
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
            _check_open(plane)            # closed by another thread meanwhile
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


def spec_of(meta: Mapping[str, Any], where: str = "snapshot") -> ExperienceSpec:
    """The spec a snapshot's metadata records (a spec that is not one is a :class:`CheckpointError`)."""
    try:
        return ExperienceSpec({k: (tuple(s), d) for k, (s, d) in meta["spec"].items()})
    except (ResearchError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(where, f"spec {str(meta.get('spec'))[:80]} is not a spec ({e})") from None


# --- what a snapshot's metadata may hold ------------------------------------------------------
_COUNT = schema.Int(0, MAX_KEYS)


def _field_problem(v: Any) -> str | None:
    ok = (isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and len(v[0]) <= 32
          and all(type(d) is int and 1 <= d < 2**31 for d in v[0]) and isinstance(v[1], str) and len(v[1]) <= 64)
    return None if ok else ("[shape, dtype]: a list of at most 32 dimensions >= 1 and a numpy dtype string "
                            "such as '<f4'")


class _Rng(schema.Checker):
    """The generator's state: PCG64's exactly (what every plane uses); another's is never applied."""

    expected = "a bit generator state"
    _pcg64 = schema.Obj({"bit_generator": schema.OneOf("PCG64"), "state": schema.Obj(
        {"bit_generator": schema.OneOf("PCG64"),
         "state": schema.Obj({"state": schema.Int(0, 2**128 - 1), "inc": schema.Int(0, 2**128 - 1)}),
         "has_uint32": schema.Int(0, 1), "uinteger": schema.Int(0, 2**32 - 1)})})
    _other = schema.Obj({"bit_generator": schema.Str(max_len=64), "state": schema.Any_()})

    def check(self, value: Any, where: str) -> Any:
        if isinstance(value, dict) and value.get("bit_generator") == "PCG64":
            return self._pcg64.check(value, where)
        return self._other.check(value, where)


_LIMITER = schema.Obj({"inserts": _COUNT, "samples": _COUNT},
                      optional={"samples_per_insert": schema.Float(0), "tolerance": schema.Float(0),
                                "min_size_to_sample": _COUNT, "timeout": schema.Maybe(schema.Float(0))})

#: what a snapshot's metadata may hold (the sampler's state: its class's :meth:`Sampler.state_schema`)
META_SCHEMA = schema.Obj(
    {"format": schema.OneOf(FORMAT), "version": schema.OneOf(FORMAT_VERSION),
     "spec": schema.Obj({}, extra=schema.Where(_field_problem), max_keys=1024),
     "capacity": schema.Int(1, MAX_KEYS), "total": _COUNT, "count": _COUNT, "first_key": _COUNT,
     "sampler": schema.Obj({"class": schema.Str(max_len=200), "state": schema.Obj({}, extra=schema.Any_())})},
    optional={"rng": schema.Maybe(_Rng()), "rate_limiter": schema.Maybe(_LIMITER),
              "created": schema.Float(), "extra": schema.Any_(), "data": schema.Any_()})


def check_meta(meta: Any, where: str = "snapshot") -> dict[str, Any]:
    """``meta`` if it is metadata a plane could have written; else a :class:`CheckpointError`.

    Checked against :data:`META_SCHEMA` (every count a whole number in ``[0, 2**62]``, the
    capacity at least 1, the generator's and rate limiter's state of the right types and
    ranges, every number finite), the sampler's state against its class's
    :meth:`~dask_research.replay.Sampler.state_schema`, and ``first_key + count == total``,
    ``count <= capacity``. ``where`` (the ``meta.json``) is named in the error.

    >>> check_meta({"format": FORMAT, "version": 1, "spec": {"x": [[], "<i8"]}, "capacity": 4,
    ...             "total": 2**63 - 1, "count": 0, "first_key": 2**63 - 1,
    ...             "sampler": {"class": "UniformSampler", "state": {}}}, "ck/v000001/meta.json")
    Traceback (most recent call last):
    ...
    dask_research.exceptions.CheckpointError: checkpoint ck/v000001/meta.json: total is 9223372036854775807; expected a whole number in [0, 4611686018427387904]; refused before use
    """
    check_format(meta, where)
    try:
        schema.check(meta, META_SCHEMA)
        info = meta["sampler"]
        klass = BUILTIN.get(info["class"])
        if klass is not None:
            schema.check(info["state"], klass.state_schema(), "sampler.state")
    except schema.Invalid as e:
        raise CheckpointError(where, f"{e}; refused before use") from None
    n, first, total, cap = meta["count"], meta["first_key"], meta["total"], meta["capacity"]
    if first + n != total:
        raise CheckpointError(where, f"first_key {first} + count {n} != total {total}; refused before use")
    if n > cap:
        raise CheckpointError(where, f"count {n} is more than the capacity {cap}; refused before use")
    return meta


def expected_arrays(meta: Mapping[str, Any], where: str = "snapshot") -> dict[str, checkpoints.Array]:
    """The arrays a checkpoint with (validated) metadata ``meta`` holds, each with its exact dtype
    and shape: ``field.<name>`` of ``(count, *shape)``, and ``sampler.leaf`` of ``(count,)`` float64
    for a prioritized sampler (for a sampler that is not built in: allowed, not required)."""
    n = meta["count"]
    out = {f"field.{f.name}": checkpoints.Array(f.dtype, (n, *f.shape))
           for f in spec_of(meta, where).fields.values()}
    klass = BUILTIN.get(meta["sampler"]["class"])
    if klass is None or klass.prioritized:
        out["sampler.leaf"] = checkpoints.Array(np.float64, (n,), required=klass is not None)
    return out


def check_format(meta: Any, where: str) -> None:
    """Refuse metadata that is not this format, or of another version."""
    if not isinstance(meta, Mapping):
        raise CheckpointError(where, f"holds {type(meta).__name__}, not a snapshot's metadata")
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
    """Replace the contents of ``plane`` with a snapshot (same spec; capacity may differ).

    The metadata is checked first (:func:`check_meta`), then the arrays (:func:`check_snapshot`).
    """
    check_meta(meta, where)
    spec = spec_of(meta, where)
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
    if sampler.prioritized and "sampler.leaf" in arrays and info_matches(meta, sampler):
        leaf = np.asarray(arrays["sampler.leaf"], dtype=np.float64)[-n:] if n else np.zeros(0)
        if n and not leaf.any():
            raise CheckpointError(where, f"every priority of the {n:,} transitions restored is 0 (the newest "
                                         f"{n:,}, as many as the plane holds): nothing could be sampled; refused")
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


def info_matches(meta: Mapping[str, Any], sampler: Sampler) -> bool:
    """Whether ``meta`` records a sampler of ``sampler``'s class (whose state and leaves it takes)."""
    info = meta.get("sampler")
    return isinstance(info, Mapping) and info.get("class") == type(sampler).__name__


def commit(plane: Restorable, path: str | os.PathLike[str], chunk: int = 16_384,
           extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], pathlib.Path]:
    """Write ``plane.snapshot(chunk)`` as the next committed version of checkpoint directory
    ``path`` through the plane's writer of that directory (which holds its lease from its first
    checkpoint there until the plane is closed), with ``extra`` (JSON-able) as ``meta["extra"]``;
    returns ``(meta as written, version directory)``."""
    if extra is not None:
        try:
            extra = jsondoc.loads(jsondoc.dumps(dict(extra)))
        except (jsondoc.Malformed, TypeError, ValueError) as e:
            raise InputError("extra", f"{str(extra)[:60]}", f"a JSON-able mapping (it {e})",
                             where="checkpoint") from None
    _check_open(plane)                   # a closed plane would take the lease and keep it
    writer = plane.checkpoint_writer(path).acquire()     # a second writer is refused before the copy
    meta, arrays = plane.snapshot(chunk)
    if extra is not None:
        meta["extra"] = extra
    return meta, writer.write(meta, arrays)


def read(path: str | os.PathLike[str], version: str | os.PathLike[str] | None = None
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], pathlib.Path]:
    """``(meta, arrays, version directory)`` of the committed checkpoint at ``path``: the
    metadata validated (:func:`check_meta`) and the data file holding exactly
    :func:`expected_arrays` before any array is read."""
    def expect(meta: dict[str, Any]) -> dict[str, checkpoints.Array]:
        where = _meta_path(path, meta_dir)
        return expected_arrays(check_meta(meta, where), where)

    meta_dir = version
    if meta_dir is None:
        _, meta_dir = checkpoints.read_meta(path)
    return checkpoints.load(path, meta_dir, expect=expect)


def _meta_path(path: str | os.PathLike[str], version: str | os.PathLike[str] | None) -> str:
    return os.path.join(os.fspath(version if version is not None else path), "meta.json")


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
    where = _meta_path(path, version)
    check_meta(meta, where)                      # before anything is built from it
    if sampler is None:
        sampler = sampler_for(meta, where)
    spec = spec_of(meta, where)
    capacity = meta["capacity"] if tiers is None else kwargs.pop("capacity", None)
    plane = factory(spec, capacity, tiers=tiers, sampler=sampler, rate_limiter=rate_limiter, **kwargs)
    try:
        meta, arrays, _ = read(path, version)    # the same version, checked again as read
        plane.load_snapshot(meta, arrays, where=str(version))
    except BaseException:
        plane.close()
        raise
    return plane


def check_snapshot(spec: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                   where: str = "snapshot") -> None:
    """Refuse a snapshot whose arrays a plane of ``spec`` would not have written.

    Restores apply what ingest applies, and more strictly (a snapshot is written by a plane, so
    nothing in it needs a cast): the metadata passes :func:`check_meta`; every field array has
    exactly the field's dtype and the shape ``(count, *field shape)``; priority leaves, if
    present, are ``count`` float64 values in ``[0, MAX_LEAF]`` (``1e280``: their sum stays
    finite), not all 0 (nothing could be sampled). Raises :class:`CheckpointError` naming
    ``where`` and the array. One pass over the leaves; the fields are checked by dtype and
    shape only.

    Parameters
    ----------
    spec : ExperienceSpec
        The spec of the plane restoring the snapshot.
    meta, arrays
        What :meth:`ExperiencePlane.snapshot` returned, or :func:`load` read.
    where : str
        What to name in errors (the checkpoint's path).
    """
    check_meta(meta, where)
    n, first = meta["count"], meta["first_key"]
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
        bad = ~((leaf >= 0) & (leaf <= MAX_LEAF))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise CheckpointError(where, f"array 'sampler.leaf' holds {float(leaf[i])!r} at {i} (key "
                                         f"{first + i}); priority leaves are finite, >= 0 and at most "
                                         f"{MAX_LEAF:g} (so that their sum stays finite)")
        if n and not leaf.any():
            raise CheckpointError(where, f"array 'sampler.leaf' is 0 for all {n:,} transitions: nothing could "
                                         "be sampled (a plane refuses priorities that would leave it so)")
