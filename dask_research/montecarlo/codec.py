"""A JSON codec for accumulator states that cannot execute code when read.

Floats are stored as exact hex strings and arrays as base64 of their bytes with a numeric
dtype, so a round trip keeps every bit; only ``None``, booleans, integers, floats, strings,
lists, tuples, string-keyed dicts, numeric numpy arrays and scalars, and :class:`Moments` are
accepted. Nothing is unpickled.

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.codec import encode, decode
>>> state = {"n": 3, "s": np.array([0.1, 0.2]), "pair": (1.5, "x")}
>>> back = decode(encode(state))
>>> back["n"], back["s"].tolist(), back["pair"]
(3, [0.1, 0.2], (1.5, 'x'))
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from .accumulators import Moments

__all__ = ["encode", "decode", "CodecError"]


class CodecError(ValueError):
    """A state that cannot be encoded, or a document that is not a valid encoding."""


_NUMERIC = set("biufc")


def encode(obj: Any) -> Any:
    """Turn a state into JSON-able data (raises :class:`CodecError` for unsupported types)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, Moments):
        return {"__moments__": obj.to_dict()}
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return {"__f__": float(obj).hex()}
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _NUMERIC:
            raise CodecError(f"arrays of dtype {obj.dtype} cannot be stored (numeric dtypes only)")
        arr = np.ascontiguousarray(obj)
        return {"__nd__": arr.dtype.str, "shape": list(arr.shape),
                "data": base64.b64encode(arr.tobytes()).decode("ascii")}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) and not k.startswith("__") for k in obj):
            raise CodecError("only dicts with string keys (not starting with '__') can be stored")
        return {k: encode(v) for k, v in obj.items()}
    raise CodecError(f"a state of type {type(obj).__name__} cannot be stored; use dicts, tuples, "
                     "numbers and numeric arrays, or give the reducer encode()/decode() methods")


def decode(doc: Any) -> Any:
    """Inverse of :func:`encode`; raises :class:`CodecError` on malformed documents."""
    if doc is None or isinstance(doc, (bool, str, int)):
        return doc
    if isinstance(doc, float):
        if math.isfinite(doc):
            return doc
        raise CodecError("non-finite bare float in a state document")
    if isinstance(doc, list):
        return [decode(v) for v in doc]
    if not isinstance(doc, dict):
        raise CodecError(f"unexpected {type(doc).__name__} in a state document")
    try:
        if "__f__" in doc:
            return float.fromhex(doc["__f__"])
        if "__moments__" in doc:
            return Moments.from_dict(doc["__moments__"])   # checked: see Moments.check
        if "__tuple__" in doc:
            return tuple(decode(v) for v in doc["__tuple__"])
        if "__nd__" in doc:
            dtype = np.dtype(doc["__nd__"])
            if dtype.kind not in _NUMERIC:
                raise CodecError(f"arrays of dtype {dtype} are not accepted")
            raw = base64.b64decode(doc["data"], validate=True)
            shape = tuple(int(s) for s in doc["shape"])
            if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(raw):
                raise CodecError(f"array data has {len(raw)} bytes, shape {shape} needs more or fewer")
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"malformed state document: {e}") from None
    if any(k.startswith("__") for k in doc):
        raise CodecError(f"unknown tag in state document: {sorted(doc)}")
    return {k: decode(v) for k, v in doc.items()}
