"""Value checks that a cast would otherwise hide: integer keys, real priorities, exact floats.

Helpers of :mod:`~dask_research.replay.spec` (ingest) and of ``update_priorities``; each costs a
dtype test, and at most one ``min``/``max`` pass where the dtypes could change a value. The
element-wise search for the culprit runs only when a value is refused.

Examples
--------
>>> import numpy as np
>>> check_int_to_float("id", np.array([16777216, 3]), np.dtype("float32"))   # exact: accepted
>>> check_int_to_float("id", np.array([16777217]), np.dtype("float32"))
Traceback (most recent call last):
...
dask_research.exceptions.SpecError: field 'id': integer 16777217 is not exactly representable in float32 (it would be stored as 16777216); give the field an integer dtype or a wider float, or convert it first
>>> key_array(np.array([2.9]), where="update_priorities")
Traceback (most recent call last):
...
dask_research.exceptions.InputError: ...
"""
from __future__ import annotations

import numpy as np

from ..exceptions import InputError, SpecError

__all__ = ["check_int_to_float", "key_array", "priority_values"]


def _mantissa_bits(dst: np.dtype) -> int:
    comp = np.dtype(dst.char.lower()) if dst.kind == "c" else dst
    return int(np.finfo(comp).nmant) + 1


def check_int_to_float(name: str, a: np.ndarray, dst: np.dtype) -> None:
    """Refuse integers of ``a`` that the float (or complex) ``dst`` cannot hold exactly.

    int64 16777217 into float32 would become 16777216: an integer id or count silently
    changed. Integers of at most ``nmant + 1`` bits (int8/int16/int32 into float64, int8/int16
    into float32) always fit and cost nothing; otherwise one ``min``/``max`` pass decides, and
    only values beyond ``2**(nmant + 1)`` are examined. Raises :class:`SpecError` naming the
    field and the first such value.
    """
    if a.dtype.kind not in "iu" or dst.kind not in "fc" or a.size == 0:
        return
    p = _mantissa_bits(dst)
    bits = a.dtype.itemsize * 8 - (a.dtype.kind == "i")
    if bits <= p:
        return
    limit = 1 << p                           # every integer of magnitude <= 2**p is exact
    lo, hi = int(a.min()), int(a.max())
    if -limit <= lo and hi <= limit:
        return
    big = a[(a > limit) | (a < -limit)] if a.dtype.kind == "i" else a[a > limit]
    u = np.abs(big).astype(np.uint64) if big.dtype.kind == "i" else big.astype(np.uint64)
    low = u & (~u + np.uint64(1))            # lowest set bit
    inexact = (u // low) >= np.uint64(limit)  # more significant bits than the mantissa holds
    if inexact.any():
        bad = big[inexact].flat[0]
        with np.errstate(over="ignore"):
            stored = np.array(bad).astype(dst).item()
        shown = int(stored.real if isinstance(stored, complex) else stored) \
            if np.isfinite(stored) else stored
        raise SpecError(name, f"integer {int(bad)} is not exactly representable in {dst} (it "
                              f"would be stored as {shown}); give the field an integer dtype "
                              "or a wider float, or convert it first")


def _example(a: np.ndarray) -> object:
    """The first value of ``a`` as Python shows it (an object array's values have no ``item()``)."""
    v = a.flat[0]
    return v.item() if isinstance(v, np.generic) else v


def key_array(indices: np.ndarray, where: str) -> np.ndarray:
    """``indices`` as int64 keys; refuses non-integers (2.9 would become key 2) and values
    beyond int64 (uint64 2**64-1 would become -1). An empty array of any dtype is no keys."""
    a = np.asarray(indices)
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise InputError("indices", f"{a.dtype} values such as {_example(a)!r}",
                         "integer keys (Batch.indices)", where=where)
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and int(a.max()) > np.iinfo(np.int64).max:
        raise InputError("indices", int(a.max()), "integer keys below 2**63", where=where)
    return a.astype(np.int64, copy=False)


def priority_values(priorities: np.ndarray, where: str) -> np.ndarray:
    """``priorities`` as float64; refuses complex and boolean values (not priorities)."""
    a = np.asarray(priorities)
    if a.size and a.dtype.kind not in "iuf":
        raise InputError("priorities", f"{a.dtype} values such as {_example(a)!r}",
                         "real numbers", where=where)
    return a.astype(np.float64, copy=False)
