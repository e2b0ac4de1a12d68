"""Content addresses: a sha256 over a canonical JSON description of a job.

The pipeline is described by its *source text* and qualified name (``dask.tokenize`` hashes
importable functions by reference, so an edited function body would keep its token), plus the
values of the module-level constants and the source of the plain functions it refers to. A
one-character change to the pipeline gives a new id; the same job gives the same id in any
process, on any day.

Examples
--------
>>> from dask_research.montecarlo.address import canonical_json, sha256_hex
>>> canonical_json({"b": 1, "a": [1.5, "x"]})
'{"a":[1.5,"x"],"b":1}'
>>> len(sha256_hex({"a": 1}))
64
"""
from __future__ import annotations

import builtins
import hashlib
import inspect
import json
import textwrap
import types
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["canonical_json", "sha256_hex", "pipeline_fingerprint"]


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace and exact (round-trip) floats."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)


def sha256_hex(obj: Any) -> str:
    """sha256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def _source(fn: Callable) -> tuple[str, str]:
    """(kind, text): the dedented source, or the bytecode when no source exists."""
    try:
        return "source", textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        code = fn.__code__
        digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode())
        return "bytecode", digest.hexdigest()


def _value_fingerprint(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value):
        return list(value)
    if isinstance(value, np.ndarray):
        return {"ndarray": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest(),
                "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    return None


def pipeline_fingerprint(fn: Callable, _seen: set | None = None) -> dict[str, Any]:
    """Describe ``fn`` for the content address: name, source and what it refers to.

    Module-level constants (numbers, strings, small tuples, numpy arrays) are included by value
    and user-defined helper functions by their own fingerprint; modules (``np``) and functions
    from installed libraries are included by name only.
    """
    _seen = set() if _seen is None else _seen
    target = inspect.unwrap(fn)
    if isinstance(target, functools_partial_type()):
        return {"partial": pipeline_fingerprint(target.func, _seen),
                "args": [_value_fingerprint(a) for a in target.args],
                "kwargs": {k: _value_fingerprint(v) for k, v in sorted(target.keywords.items())}}
    if not isinstance(target, types.FunctionType):
        call = getattr(type(target), "__call__", None)
        out = {"qualname": type(target).__qualname__,
               "state": {k: _value_fingerprint(v) for k, v in sorted(vars(target).items())}
               if hasattr(target, "__dict__") else None}
        if isinstance(call, types.FunctionType):
            out["call"] = pipeline_fingerprint(call, _seen)
        return out
    kind, text = _source(target)
    # The qualified name, not the module: the same file run as a script (__main__), imported,
    # or loaded by the CLI must give the same address.
    out: dict[str, Any] = {
        "qualname": target.__qualname__,
        kind: text,
        "defaults": [_value_fingerprint(v) for v in (target.__defaults__ or ())],
    }
    _seen.add(id(target))
    try:
        refs = inspect.getclosurevars(target)
    except (TypeError, ValueError):
        return out
    names = {**refs.globals, **refs.nonlocals}
    deps: dict[str, Any] = {}
    for name in sorted(names):
        value = names[name]
        if isinstance(value, types.ModuleType):
            deps[name] = {"module": value.__name__}
        elif isinstance(value, types.FunctionType) and _is_user_function(value, target):
            if id(value) not in _seen:
                deps[name] = pipeline_fingerprint(value, _seen)
        elif callable(value):
            deps[name] = {"callable": f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', name)}"}
        else:
            fp = _value_fingerprint(value)
            deps[name] = fp if fp is not None else {"type": type(value).__qualname__}
    if deps:
        out["refs"] = deps
    return out


def _is_user_function(value: types.FunctionType, pipeline: types.FunctionType) -> bool:
    mod = value.__module__ or ""
    return mod == pipeline.__module__ or mod == "__main__" or not _is_installed_module(mod)


def _is_installed_module(mod: str) -> bool:
    top = mod.split(".")[0]
    return top in {"numpy", "scipy", "math", "dask", "distributed", "builtins", "torch", "cupy",
                   "pandas", "numba", "jax"} or hasattr(builtins, top)


def functools_partial_type():
    import functools

    return functools.partial
