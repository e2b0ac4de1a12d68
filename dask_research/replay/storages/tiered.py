"""Tiers with byte capacities, composed into one logical storage (:class:`TieredStorage`).

A tier is a description (``DeviceTier("2GiB")``, ``HostTier("16GiB")``, ``DiskTier(path)``):
a kind of memory, a capacity in bytes (parsed with :func:`dask.utils.parse_bytes`) and a read
bandwidth, declared or measured once when the storage is built. ``TieredStorage`` builds one
storage per tier, orders them fastest first and keeps a location map from logical slot (the
plane's ring position) to ``(tier, row)``. A tier never holds more rows than
``capacity // itemsize``, nor more than the plane's capacity (a tier's size is an upper bound);
the total capacity is the sum unless ``capacity=`` asks for less. Storage and the location map
grow with what is stored: memory is reserved, not touched, until a row is written (the map
costs 9 bytes per stored transition, 1 + 4 + 4 for tier, row and back-pointer). Which slot lives in which tier is
decided by :class:`~dask_research.replay.tier_placement.Placement`; new transitions overwrite the
slot they replace in place, or take a free row in the fastest tier that has one.

Examples
--------
>>> import numpy as np, tempfile
>>> from dask_research.replay import ExperienceSpec, HostTier, DiskTier, TieredStorage
>>> spec = ExperienceSpec({"r": ((), "float64")})          # 8-byte records
>>> ts = TieredStorage(spec, [HostTier("64B", bandwidth=1e10),
...                           DiskTier(tempfile.mkdtemp(), "64B", bandwidth=1e9)])
>>> ts.capacity, [t.rows for t in ts.storages]
(16, [8, 8])
>>> ts.write_fields(0, {"r": np.arange(10.0)})
>>> ts.occupancy()
[8, 2]
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from dask.utils import format_bytes, parse_bytes

from ...exceptions import CapacityError, InputError
from ..spec import ExperienceSpec
from .base import Storage
from .device import DeviceStorage
from .disk import DiskStorage
from .host import HostStorage


def _parse_capacity(capacity: int | str | None, where: str) -> int | None:
    if capacity is None:
        return None
    try:
        nbytes = parse_bytes(capacity) if isinstance(capacity, str) else int(capacity)
    except (ValueError, TypeError):
        raise InputError("capacity", capacity, "a byte count like 2**30 or '2GiB'", where=where)
    if nbytes <= 0:
        raise InputError("capacity", capacity, "a positive number of bytes", where=where)
    return nbytes


class Tier:
    """Description of one tier: capacity in bytes, read bandwidth, and how to build it.

    Parameters
    ----------
    capacity : int or str, optional
        Bytes of records the tier may hold (``"2GiB"``, ``2**31``). ``None`` (disk only):
        whatever the plane's capacity leaves to it.
    bandwidth : float, optional
        Declared random-read bandwidth in bytes/s; measured once on the built storage if
        omitted. Placement puts the hottest data in the tier with the highest bandwidth.
    name : str, optional
    """

    kind = "abstract"

    def __init__(self, capacity: int | str | None = None, bandwidth: float | None = None,
                 name: str | None = None):
        self.name = name or self.kind
        self.capacity = _parse_capacity(capacity, f"{type(self).__name__} {self.name!r}")
        if bandwidth is not None and (isinstance(bandwidth, (bool, str)) or not bandwidth > 0):
            raise InputError("bandwidth", bandwidth, "a positive number of bytes/s",
                             where=f"{type(self).__name__} {self.name!r}")
        self.bandwidth = bandwidth

    def build(self, spec: ExperienceSpec, rows: int) -> Storage:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        cap = "unbounded" if self.capacity is None else format_bytes(self.capacity)
        bw = "" if self.bandwidth is None else f", bandwidth={self.bandwidth:.3g}"
        return f"{type(self).__name__}({cap!r}{bw}, name={self.name!r})"


class HostTier(Tier):
    """Host memory (numpy)."""

    kind = "host"

    def __init__(self, capacity: int | str, bandwidth: float | None = None, name: str | None = None):
        if capacity is None:
            raise InputError("capacity", None, "a byte count such as '16GiB'", where="HostTier")
        super().__init__(capacity, bandwidth, name)

    def build(self, spec: ExperienceSpec, rows: int) -> Storage:
        return HostStorage(spec, rows, name=self.name)


class DeviceTier(Tier):
    """GPU memory (CuPy on ``device``; ``xp=numpy`` builds a CPU stand-in for tests)."""

    kind = "device"

    def __init__(self, capacity: int | str, bandwidth: float | None = None, name: str | None = None,
                 device: int = 0, xp: ModuleType | None = None):
        if capacity is None:
            raise InputError("capacity", None, "a byte count such as '2GiB'", where="DeviceTier")
        super().__init__(capacity, bandwidth, name)
        self.device = device
        self.xp = xp

    def build(self, spec: ExperienceSpec, rows: int) -> Storage:
        return DeviceStorage(spec, rows, name=self.name, device=self.device, xp=self.xp)


class DiskTier(Tier):
    """A numpy memmap under ``path``; ``capacity=None`` takes whatever the plane needs."""

    kind = "disk"

    def __init__(self, path: str | os.PathLike, capacity: int | str | None = None,
                 bandwidth: float | None = None, name: str | None = None):
        super().__init__(capacity, bandwidth, name)
        if not isinstance(path, (str, os.PathLike)):
            raise InputError("path", path, "a directory path (str or path-like)",
                             where=f"DiskTier {self.name!r}")
        self.path = path

    def build(self, spec: ExperienceSpec, rows: int) -> Storage:
        return DiskStorage(spec, rows, self.path, name=self.name)


class _Shifted:
    """Read-only ``a - 1`` of an array stored plus one (so that zero, the untouched page's
    value, means "none"), computed for the indexed entries only."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray):
        self.a = a

    def __getitem__(self, idx: Any) -> Any:
        return self.a[idx] - self.a.dtype.type(1)

    def __len__(self) -> int:
        return len(self.a)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.a - self.a.dtype.type(1)
        return out if dtype is None else out.astype(dtype)


def _index_dtype(n: int) -> type[np.signedinteger[Any]]:
    """The narrowest of int32/int64 that holds ``0..n``."""
    return np.int32 if n < 2**31 - 1 else np.int64


class TieredStorage:
    """Storages of several tiers behind one slot -> (tier, row) map, fastest tier first.

    Parameters
    ----------
    spec : ExperienceSpec
    tiers : sequence of Tier
    capacity : int, optional
        Transitions the plane keeps. Default: the sum of the tiers' rows (then no tier may be
        unbounded). With unbounded tiers, they share what the bounded ones leave.

    Raises
    ------
    CapacityError
        If the tiers cannot hold ``capacity`` transitions, or a tier is smaller than a record.
    """

    kind = "tiered"

    def __init__(self, spec: ExperienceSpec, tiers: Sequence[Tier], capacity: int | None = None):
        self.spec = spec
        tiers = list(tiers)
        if not tiers or not all(isinstance(t, Tier) for t in tiers):
            raise InputError("tiers", tiers, "a non-empty list of DeviceTier/HostTier/DiskTier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise InputError("tiers", names, "tiers with distinct names (pass name=...)")
        item = spec.itemsize
        rows: list[int | None] = []
        for t in tiers:
            if t.capacity is None:
                rows.append(None)
                continue
            r = t.capacity // item
            if r < 1:
                raise CapacityError(f"tier {t.name!r} (one {item}-byte record)", item, t.capacity)
            rows.append(r if capacity is None else min(r, int(capacity)))   # an upper bound
        bounded = sum(r for r in rows if r is not None)
        unbounded = [i for i, r in enumerate(rows) if r is None]
        if capacity is None:
            if unbounded:
                raise InputError("capacity", None, "a number of transitions when a tier "
                                 f"({tiers[unbounded[0]].name!r}) has no byte capacity")
            capacity = bounded
        capacity = int(capacity)
        if unbounded:
            left = max(capacity - bounded, 0)
            share, extra = divmod(left, len(unbounded))
            for j, i in enumerate(unbounded):
                rows[i] = max(1, share + (1 if j < extra else 0))
        sized = [int(r) for r in rows if r is not None]          # every tier has rows now
        total = sum(sized)
        if total < capacity:
            raise CapacityError(f"a plane of {capacity:,} transitions of {item} bytes",
                                capacity * item, total * item)
        self.capacity = capacity
        built: list[Storage] = []
        try:
            for t, r in zip(tiers, sized):
                built.append(t.build(spec, r))
            bws = [t.bandwidth if t.bandwidth is not None else s.measure_bandwidth()
                   for t, s in zip(tiers, built)]
            self._place(tiers, built, bws, sized)
        except BaseException:
            for s in built:          # a tier that cannot be built leaves no disk file behind
                s.close()
            raise

    def _place(self, tiers: list[Tier], built: list[Storage], bws: list[float],
               sized: list[int]) -> None:
        capacity = self.capacity
        self.bandwidth_declared = [t.bandwidth is not None for t in tiers]
        order = sorted(range(len(tiers)), key=lambda i: -bws[i])          # stable: ties keep order
        self.tiers = [tiers[i] for i in order]
        self.storages: list[Storage] = [built[i] for i in order]
        self.bandwidths = [float(bws[i]) for i in order]
        self.bandwidth_declared = [self.bandwidth_declared[i] for i in order]
        # The location map, zero-initialised so that the kernel hands out its pages only when a
        # slot is first written (np.zeros/np.empty of a large array: untouched virtual memory).
        # _tier1 holds tier + 1 (0: no tier yet); _slot1 holds slot + 1 (0: a free row).
        self._tier1 = np.zeros(capacity, dtype=np.int8)
        self.row_of = np.zeros(capacity, dtype=_index_dtype(max(sized)))
        self._slot1 = [np.zeros(s.rows, dtype=_index_dtype(capacity + 1)) for s in self.storages]
        # free rows: the rows above a high-water mark, plus a stack of rows released by moves
        self._fresh = [0 for _ in self.storages]
        self._stack = [np.empty(s.rows, dtype=_index_dtype(s.rows)) for s in self.storages]
        self._nstack = [0 for _ in self.storages]
        self._nfree = [s.rows for s in self.storages]
        self.moves = 0

    @property
    def tier_of(self) -> _Shifted:
        """Tier of each slot, fastest first (-1: not written yet): ``tier_of[slots]``."""
        return _Shifted(self._tier1)

    @property
    def slot_at(self) -> list[_Shifted]:
        """Per tier, the slot each row holds (-1: a free row): ``slot_at[k][rows]``."""
        return [_Shifted(a) for a in self._slot1]

    @property
    def rows(self) -> int:
        return self.capacity

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.storages)

    def occupancy(self) -> list[int]:
        """Used rows per tier, fastest first."""
        return [s.rows - nf for s, nf in zip(self.storages, self._nfree)]

    def tier_stats(self, used: int) -> list[dict[str, Any]]:
        """The ``tiers`` entry of ``plane.stats()``: occupancy, bytes and bandwidth per tier
        (``used``, the plane's size, is their sum)."""
        itemsize = self.spec.itemsize
        return [{"name": t.name, "kind": s.kind, "used": u, "rows": s.rows,
                 "bytes_used": u * itemsize, "capacity_bytes": s.nbytes, "bandwidth": bw}
                for t, s, u, bw in zip(self.tiers, self.storages, self.occupancy(), self.bandwidths)]

    def device_rows(self, slots: np.ndarray) -> tuple[Any, np.ndarray] | None:
        """``(device storage, rows)`` if every slot lives in the same GPU tier, else None."""
        if len(slots) == 0:
            return None
        tiers = self._tier1[slots] - 1
        k = int(tiers[0])
        s = self.storages[k]
        if s.kind != "device" or not getattr(s, "_on_gpu", False) or not (tiers == k).all():
            return None
        return s, self.row_of[slots]

    # --- row allocation ---------------------------------------------------------------
    def _pop(self, k: int, n: int) -> np.ndarray:
        nf = self._nfree[k]
        if n > nf:  # pragma: no cover - guarded by callers
            raise CapacityError(f"tier {self.tiers[k].name!r}", n * self.spec.itemsize,
                                nf * self.spec.itemsize)
        ns = self._nstack[k]
        a = min(n, ns)                               # released rows first, then fresh ones
        reused = self._stack[k][ns - a:ns][::-1].astype(np.int64)
        self._nstack[k] = ns - a
        lo = self._fresh[k]
        self._fresh[k] = lo + (n - a)
        self._nfree[k] = nf - n
        return np.concatenate([reused, np.arange(lo, lo + n - a, dtype=np.int64)])

    def _push(self, k: int, rows: np.ndarray) -> None:
        ns = self._nstack[k]
        self._stack[k][ns:ns + len(rows)] = rows[::-1]
        self._nstack[k] = ns + len(rows)
        self._nfree[k] += len(rows)
        self._slot1[k][rows] = 0

    def _assign(self, slots: np.ndarray, tiers: np.ndarray, rows: np.ndarray) -> None:
        self._tier1[slots] = tiers + 1
        self.row_of[slots] = rows
        for k in np.unique(tiers):
            m = tiers == k
            self._slot1[int(k)][rows[m]] = slots[m] + 1

    # --- data path --------------------------------------------------------------------
    def write_fields(self, start: int, fields: Mapping[str, np.ndarray]) -> None:
        """Write fields into slots ``start`` to ``start + n - 1``: in place, or into free fast rows."""
        n = len(next(iter(fields.values())))
        slots = np.arange(start, start + n, dtype=np.int64)
        new = slots[self._tier1[slots] == 0]
        if len(new):
            t = np.empty(len(new), dtype=np.int8)
            r = np.empty(len(new), dtype=np.int64)
            done = 0
            for k in range(len(self.storages)):
                take = min(self._nfree[k], len(new) - done)
                if take:
                    t[done:done + take] = k
                    r[done:done + take] = self._pop(k, take)
                    done += take
                if done == len(new):
                    break
            self._assign(new, t, r)
        rec = self.spec.pack(fields)
        tiers = self._tier1[slots] - 1
        rows = self.row_of[slots]
        for k in np.unique(tiers):
            m = tiers == k
            self.storages[int(k)].write_records(rows[m], rec[m] if not m.all() else rec)

    def read_records(self, slots: np.ndarray, out: np.ndarray) -> None:
        """Gather ``slots`` into ``out``, each tier reading its own rows."""
        tiers = self._tier1[slots] - 1
        rows = self.row_of[slots]
        first = tiers[0] if len(tiers) else 0
        if (tiers == first).all():
            self.storages[int(first)].read_records(rows, out)
            return
        void = np.dtype((np.void, self.spec.itemsize))
        ov = out.view(void)
        for k in np.unique(tiers):
            m = tiers == k
            tmp = self.spec.empty(int(m.sum()))
            self.storages[int(k)].read_records(rows[m], tmp)
            ov[m] = tmp.view(void)

    def move(self, slots: np.ndarray, dest: np.ndarray) -> int:
        """Move ``slots`` to tiers ``dest`` (through a host staging buffer). Returns the count.

        The caller guarantees that the final placement fits (each tier's incoming rows do not
        exceed its free rows after the outgoing ones are released).
        """
        if len(slots) == 0:
            return 0
        rec = self.spec.empty(len(slots))
        self.read_records(slots, rec)
        cur = self._tier1[slots] - 1
        rows = self.row_of[slots]
        for k in np.unique(cur):
            self._push(int(k), rows[cur == k])
        new_rows = np.empty(len(slots), dtype=np.int64)
        for k in np.unique(dest):
            m = dest == k
            r = self._pop(int(k), int(m.sum()))
            self.storages[int(k)].write_records(r, rec[m])
            new_rows[m] = r
        self._assign(slots, dest.astype(np.int8), new_rows)
        self.moves += len(slots)
        return len(slots)

    def close(self) -> None:
        for s in self.storages:
            s.close()

    def __repr__(self) -> str:
        inner = ", ".join(f"{t.name}:{s.rows:,}" for t, s in zip(self.tiers, self.storages))
        return f"TieredStorage([{inner}], capacity={self.capacity:,})"
