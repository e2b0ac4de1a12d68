"""What one transition holds: :class:`ExperienceSpec` and the validation of ingest batches.

A spec maps field names to ``(shape, dtype)``. Storages keep one *record* per transition, a
numpy structured dtype with the fields aligned (``align=True``) so that every field of a
gathered batch is a strided view that numpy, torch (``from_numpy``) and DLPack accept without
a copy.

Ingest batches are dicts of arrays (numpy, torch, CuPy or anything ``np.asarray`` takes), of one
transition (each field has the spec's shape) or of many (a leading batch axis). Every field is
checked before anything is written, so a bad batch raises :class:`~dask_research.exceptions.
SpecError` naming the field and leaves the storage untouched.

Examples
--------
>>> import numpy as np
>>> from dask_research.replay import ExperienceSpec
>>> spec = ExperienceSpec({"obs": ((4,), "float32"), "action": ((), "int64")})
>>> spec.itemsize
24
>>> fields, n = spec.validate({"obs": np.zeros((8, 4)), "action": np.arange(8)})
>>> n, fields["obs"].shape
(8, (8, 4))
>>> spec.validate({"obs": np.zeros(4), "action": 3})[1]   # one transition
1
>>> spec.validate({"obs": np.zeros((8, 3)), "action": np.arange(8)})
Traceback (most recent call last):
...
dask_research.exceptions.SpecError: field 'obs': shape (8, 3) is neither one transition (4,) nor a batch (n, 4)
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import SpecError
from .exact import check_int_to_float

#: names a field may not take: they are attributes of a delivered :class:`Batch`
RESERVED = frozenset({"indices", "weights", "info", "keys", "items", "values", "get", "data"})


@dataclass(frozen=True)
class Field:
    """One field of a transition: ``name``, per-transition ``shape`` and numpy ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of this field in one transition."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _whole(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _field(name: Any, desc: Any) -> Field:
    if not isinstance(name, str) or not name:
        raise SpecError(None, f"field names are non-empty strings; got {name!r}")
    if name in RESERVED:
        raise SpecError(name, f"is reserved (a batch attribute); choose another name, not one of "
                              f"{sorted(RESERVED)}")
    described = "is described by (shape, dtype) or {'shape': ..., 'dtype': ...}, e.g. ((4,), 'float32')"
    if isinstance(desc, Mapping):
        if set(desc) != {"shape", "dtype"}:
            raise SpecError(name, f"{described}; got {desc!r}")
        shape, dtype = desc["shape"], desc["dtype"]
    else:
        try:
            shape, dtype = desc
        except (TypeError, ValueError):
            raise SpecError(name, f"{described}; got {desc!r}") from None
    if _whole(shape):
        shape = (shape,)
    dims = tuple(shape) if isinstance(shape, Iterable) and not isinstance(shape, (str, bytes)) else None
    if dims is None or not all(_whole(s) for s in dims):
        raise SpecError(name, f"shape must be a tuple of whole numbers; got {shape!r}")
    shape = tuple(int(s) for s in dims)
    if any(s <= 0 for s in shape):
        raise SpecError(name, f"shape {shape} has a non-positive dimension")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise SpecError(name, f"dtype {dtype!r} is not a numpy dtype")
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise SpecError(name, f"dtype {dt} is not a plain numeric or bool dtype")
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes >= 2**31:                   # numpy's limit for a record field
        raise SpecError(name, f"shape {shape} of {dt} is {nbytes:,} bytes per transition; a "
                        "field holds less than 2 GiB")
    return Field(name, shape, dt.newbyteorder("=") if dt.byteorder == ">" else dt)


def priority_arrays(indices: Any, priorities: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(int64 keys, float64 priorities)``, flat, one priority per index (numpy, torch, CuPy)."""
    from ..exceptions import InputError
    from .exact import key_array, priority_values

    def host(name: str, x: Any, expected: str) -> np.ndarray:
        try:
            return _as_numpy(name, x)
        except SpecError:     # an argument, not a field of the spec: say so in the argument's terms
            shown = repr(x)
            raise InputError(name, shown if len(shown) <= 60 else shown[:57] + "...", expected,
                             where=where) from None

    keys = key_array(host("indices", indices, "integer keys below 2**63 (Batch.indices)"), where).reshape(-1)
    pr = priority_values(host("priorities", priorities, "real numbers"), where).reshape(-1)
    if len(pr) != len(keys):
        raise InputError("priorities", f"{len(pr)} values", f"one per index ({len(keys)})", where=where)
    return keys, pr


def _as_numpy(name: str, x: Any) -> np.ndarray:
    """Host numpy view of ``x`` (numpy, torch, CuPy, scalars, lists) without copying if possible."""
    if isinstance(x, np.ma.MaskedArray):      # its masked values would be stored unchecked
        raise SpecError(name, "is a masked array; masked entries have no value to store: fill "
                              "them first, e.g. x.filled(0)")
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        try:
            return x.detach().cpu().numpy()
        except TypeError as e:  # e.g. bfloat16 has no numpy dtype
            raise SpecError(name, f"torch tensor of dtype {x.dtype} has no numpy equivalent ({e})")
    if mod.startswith("cupy"):
        return x.get()
    a = np.asarray(x)
    if a.dtype == object:
        raise SpecError(name, f"could not be read as a numeric array (got {type(x).__name__})")
    return a


def _check_fits(name: str, a: np.ndarray, dst: np.dtype) -> None:
    """Refuse values of ``a`` that a narrowing cast to ``dst`` would change beyond rounding.

    Called only when ``a.dtype`` does not cast to ``dst`` safely. Integers must lie in ``dst``'s
    range (300 into int8 would wrap to 44); finite floats must stay finite (1e300 into float32
    would become inf). Rounding to the nearer representable value is not refused. The check is
    one ``min``/``max`` per array; the element-wise search for the culprit runs only on failure.
    """
    if a.size == 0:
        return
    if dst.kind in "iu":
        info = np.iinfo(dst)
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max:
            bad = a[(a < info.min) | (a > info.max)].flat[0]
            raise SpecError(name, f"value {bad.item()!r} does not fit in {dst} (range {info.min}..{info.max}); "
                                  "clip or cast it first, or give the field a wider dtype")
        return
    if dst.kind not in "fc":              # bool: only bool casts to it (same_kind)
        return
    comp = np.dtype(dst.char.lower()) if dst.kind == "c" else dst
    fmax = float(np.finfo(comp).max)
    parts = (a.real, a.imag) if a.dtype.kind == "c" else (a,)
    for part in parts:
        lo, hi = part.min(), part.max()
        if -fmax <= lo and hi <= fmax:    # also False for NaN and inf: look closer
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            over = np.isfinite(part) & ~np.isfinite(part.astype(comp))
        if over.any():
            bad = part[over].flat[0]
            raise SpecError(name, f"value {bad.item()!r} overflows {dst} (largest {fmax:.8g}); "
                                  "scale or clip it first, or give the field a wider dtype")


def _check_flags(name: str, a: np.ndarray) -> None:
    """Numbers stored into a bool field (a framework's float or int ``done``) must be 0 or 1.

    The cast is then exact (0 -> False, 1 -> True); any other value (0.5, 2, NaN) is refused,
    since reading it as a flag would be a guess.
    """
    bad = (a != 0) & (a != 1)
    if bad.any():
        v = a[bad].flat[0]
        raise SpecError(name, f"value {v.item()!r} is not a flag: a bool field takes bools or the "
                              "numbers 0 and 1; give the field a numeric dtype to store other values")


def _scalar_check(f: Field):
    """A check for one Python/numpy scalar into scalar field ``f``: True if it may be written.

    False for anything the check cannot vouch for cheaply; the caller then takes the general
    path (:meth:`ExperienceSpec.validate`), which accepts or refuses it with the usual message.
    The rules are those of ``validate``: same kind or a safe widening, ints within range,
    finite floats that stay finite, 0/1 numbers into a bool field.
    """
    dt = f.dtype
    kind = dt.kind
    if kind == "b":
        def check(v: Any) -> bool:
            t = type(v)
            if t is bool or t is np.bool_:
                return True
            if t is int or t is float or (isinstance(v, np.generic) and v.dtype.kind in "iuf"):
                return bool(v == 0 or v == 1)
            return False
        return check
    if kind in "iu":
        info = np.iinfo(dt)
        lo, hi = int(info.min), int(info.max)

        def check(v: Any) -> bool:
            t = type(v)
            if t is int:
                return lo <= v <= hi
            if t is bool:
                return True
            if isinstance(v, np.generic):
                if v.dtype == dt:
                    return True
                if v.dtype.kind in "biu":
                    return lo <= int(v) <= hi
            return False
        return check
    if kind == "f":
        fmax = float(np.finfo(dt).max)
        inf = float("inf")
        exact = 1 << (int(np.finfo(dt).nmant) + 1)    # ints up to this magnitude cast exactly

        def check(v: Any) -> bool:
            t = type(v)
            if t is float:                # finite values must stay finite; inf/nan are kept
                return -fmax <= v <= fmax or v != v or v == inf or v == -inf
            if t is int:                  # larger ints: validate decides (16777217 would round)
                return -exact <= v <= exact
            if t is bool:
                return True
            if isinstance(v, np.generic):
                if v.dtype == dt:
                    return True
                if v.dtype.kind in "iu" and not -exact <= int(v) <= exact:
                    return False
                if v.dtype.kind in "biuf":
                    w = float(v)
                    return -fmax <= w <= fmax or w != w or w == inf or w == -inf
            return False
        return check

    def check_exact(v: Any) -> bool:
        return isinstance(v, np.generic) and v.dtype == dt
    return check_exact


def _array_check(f: Field):
    """A check for a numpy array of exactly ``f``'s shape and dtype."""
    dt, shape = f.dtype, f.shape

    def check(v: Any) -> bool:
        return type(v) is np.ndarray and v.dtype == dt and v.shape == shape
    return check


def add_checks(spec: ExperienceSpec) -> dict[str, Any]:
    """Per-field checks of one transition for ``ExperiencePlane.add``'s fast path: each takes
    a value and says whether writing it into the field's slot is exactly what ``validate``
    followed by a write would store."""
    out: dict[str, Any] = {}
    for name, f in spec.fields.items():
        if f.shape:
            out[name] = _array_check(f)
        else:
            sc, ar = _scalar_check(f), _array_check(f)

            def check(v: Any, sc=sc, ar=ar) -> bool:
                return ar(v) if type(v) is np.ndarray else sc(v)
            out[name] = check
    return out


def _is_tensordict(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("tensordict") and hasattr(x, "batch_size")


def _from_tensordict(td: Any) -> dict[str, Any]:
    """A TensorDict's leaves as a flat dict; nested keys are joined with ``"."``.

    ``TensorDict({"obs": ..., "next": {"obs": ...}}, batch_size=[n])`` gives the fields
    ``"obs"`` and ``"next.obs"``; the batch size is the leading dimension as usual (a TensorDict
    with ``batch_size=[]`` is one transition). Leaves go through the usual validation, so a
    non-tensor leaf is refused naming its key.
    """
    try:
        items = td.items(include_nested=True, leaves_only=True)
    except TypeError:                          # a TensorDict-like without nested keys
        items = td.items()
    out: dict[str, Any] = {}
    for k, v in items:
        out[k if isinstance(k, str) else ".".join(map(str, k))] = v
    return out


class ExperienceSpec:
    """The fields of one transition, each with a shape and a dtype.

    Parameters
    ----------
    fields : mapping of name to ``(shape, dtype)`` or ``{"shape": ..., "dtype": ...}``, or an ExperienceSpec
        ``shape`` is the per-transition shape (``()`` for a scalar), ``dtype`` anything
        ``numpy.dtype`` accepts.

    Examples
    --------
    >>> spec = ExperienceSpec({"obs": ((4,), "float32"), "done": ((), "bool")})
    >>> spec.names
    ('obs', 'done')
    >>> spec.record_dtype.itemsize          # 16 bytes of obs + 1 of done, aligned to 4
    20
    """

    def __init__(self, fields: Mapping[str, Any] | ExperienceSpec):
        if isinstance(fields, ExperienceSpec):
            fields = fields.to_dict()
        if not isinstance(fields, Mapping) or not fields:
            raise SpecError(None, "a spec is a non-empty mapping of field name -> (shape, dtype)")
        self.fields: dict[str, Field] = {n: _field(n, d) for n, d in fields.items()}
        self.names: tuple[str, ...] = tuple(self.fields)
        total = sum(math.prod(f.shape) * f.dtype.itemsize + 16 for f in self.fields.values())
        if total >= 2**31:                # numpy's record offsets would wrap round
            raise SpecError(None, f"a transition of these fields is about {total:,} bytes; a "
                            "record holds less than 2 GiB")
        self.record_dtype = np.dtype(
            [(f.name, f.dtype, f.shape) if f.shape else (f.name, f.dtype)
             for f in self.fields.values()], align=True)
        self.itemsize: int = self.record_dtype.itemsize

    # --- description ------------------------------------------------------------------
    def to_dict(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype string)}``, JSON-friendly and accepted by the constructor."""
        return {f.name: (f.shape, f.dtype.str) for f in self.fields.values()}

    def to_json(self) -> str:
        return json.dumps({n: [list(s), d] for n, (s, d) in self.to_dict().items()})

    @classmethod
    def from_json(cls, text: str) -> ExperienceSpec:
        return cls({n: (tuple(s), d) for n, (s, d) in json.loads(text).items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExperienceSpec) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name!r}: ({f.shape}, {str(f.dtype)!r})" for f in self.fields.values())
        return f"ExperienceSpec({{{inner}}})"

    def empty(self, n: int) -> np.ndarray:
        """An uninitialised structured array of ``n`` records."""
        return np.empty(n, dtype=self.record_dtype)

    # --- validation ---------------------------------------------------------------------
    def validate(self, batch: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """Check ``batch`` against the spec; return ``(fields, n)`` with a leading batch axis.

        A ``tensordict.TensorDict`` is accepted: its leaves are the fields, nested keys joined
        with ``"."`` (``("next", "obs")`` is the field ``"next.obs"``).

        Nothing is copied unless needed (torch CPU tensors and numpy arrays are viewed; CuPy
        arrays are copied to the host). Dtypes are cast on write; a cast that changes the kind
        (float to int, complex to float) is refused, except numbers into a bool field, which
        must all be 0 or 1 (the float or int ``done`` flags of RL frameworks); so is a
        narrowing cast whose values do not
        fit (an int64 300 into int8, a float64 1e300 into float32), checked only when the
        dtypes narrow. Raises :class:`SpecError` naming the field.
        """
        if type(batch) is not dict:
            if _is_tensordict(batch):
                batch = _from_tensordict(batch)
            elif not isinstance(batch, Mapping):
                raise SpecError(None, "a batch is a mapping of field name -> array; "
                                      f"got {type(batch).__name__}")
            else:
                bad = next((k for k in batch if not isinstance(k, str)), None)
                if bad is not None:
                    raise SpecError(None, f"a batch's keys are field names (str); iterating the "
                                          f"{type(batch).__name__} gave a {type(bad).__name__}")
        fields = self.fields
        if len(batch) != len(fields) or any(k not in fields for k in batch):
            for k in batch:
                if k not in fields:
                    raise SpecError(k, f"is not in the spec (fields: {', '.join(self.names)})")
            for k in fields:
                if k not in batch:
                    raise SpecError(k, f"is missing from the batch (fields: {', '.join(self.names)})")
        out: dict[str, np.ndarray] = {}
        n = -1
        single: bool | None = None
        first = ""
        for name, f in fields.items():
            a = _as_numpy(name, batch[name])
            shape = a.shape
            nd = len(f.shape)
            if shape == f.shape:
                one = True
            elif a.ndim == nd + 1 and shape[1:] == f.shape:
                one = False
            else:
                want = ", ".join(["n", *map(str, f.shape)])
                raise SpecError(name, f"shape {shape} is neither one transition {f.shape} "
                                      f"nor a batch ({want})")
            if a.dtype != f.dtype:
                if f.dtype.kind == "b" and a.dtype.kind in "iuf":
                    _check_flags(name, a)     # float or int dones: exactly 0 or 1
                elif not np.can_cast(a.dtype, f.dtype, "same_kind"):
                    raise SpecError(name, f"dtype {a.dtype} cannot be stored as {f.dtype} without "
                                          f"changing kind; cast it first, e.g. x.astype({str(f.dtype)!r})")
                if not np.can_cast(a.dtype, f.dtype, "safe"):
                    _check_fits(name, a, f.dtype)
                if a.dtype.kind in "iu" and f.dtype.kind in "fc":
                    check_int_to_float(name, a, f.dtype)     # 16777217 -> float32 changes it
            if single is None:
                single, first = one, name
                n = 1 if one else shape[0]
            elif one != single:
                a_desc = "one transition" if one else f"a batch of {shape[0]}"
                b_desc = "one transition" if single else f"a batch of {n}"
                raise SpecError(name, f"holds {a_desc} but field {first!r} holds {b_desc}")
            elif not one and shape[0] != n:
                raise SpecError(name, f"has {shape[0]} transitions but field {first!r} has {n}")
            out[name] = a[None] if one else a
        if n == 0:
            raise SpecError(None, "the batch holds no transitions")
        return out, n

    def pack(self, fields: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Copy validated ``fields`` (from :meth:`validate`) into a structured record array."""
        n = len(next(iter(fields.values())))
        rec = self.empty(n) if out is None else out
        for name, a in fields.items():
            rec[name] = a
        return rec
