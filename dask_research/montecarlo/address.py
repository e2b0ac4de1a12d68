"""Content addresses: a sha256 over a canonical JSON description of a job.

The pipeline is described by its *source text* and qualified name (``dask.tokenize`` hashes
importable functions by reference, so an edited function body would keep its token), plus the
values of the module-level constants and the source of the plain functions it refers to. A
one-character change to the pipeline gives a new id; the same job gives the same id in any
process, on any day. A function with no source text (typed into a console, ``python -c``) is
described by its code instead (bytecode, names, constants; nested code by its own digest), so
it too has one id in every process of the same Python version; it is not the id the same text
gets from a file (the console cannot show its source).

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
import math
import textwrap
import types
from collections.abc import Callable
from typing import Any, cast

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
        return "bytecode", _code_digest(fn.__code__)


def _code_digest(code: types.CodeType) -> str:
    """sha256 of what a code object computes: its bytecode, names and constants, with nested code
    objects (a comprehension, a lambda, an inner function) by their own digest and sets in a fixed
    order, never by a ``repr`` that holds a memory address or depends on string hashing (the same
    function typed into two consoles once got two addresses).

    >>> f = eval("lambda xs: [x * 2 for x in xs if x in {'a', 'b'}]")
    >>> g = eval("lambda xs: [x * 2 for x in xs if x in {'b', 'a'}]")
    >>> _code_digest(f.__code__) == _code_digest(g.__code__) != _code_digest((lambda xs: xs).__code__)
    True
    """
    def const(c: Any) -> str:
        if isinstance(c, types.CodeType):
            return "code:" + _code_digest(c)
        if isinstance(c, (tuple, frozenset)):
            parts = [const(x) for x in c]
            return f"{type(c).__name__}({','.join(sorted(parts) if isinstance(c, frozenset) else parts)})"
        return f"{type(c).__name__}:{c!r}"

    h = hashlib.sha256(code.co_code)
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode())
    h.update(const(code.co_consts).encode())
    return h.hexdigest()


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


def pipeline_fingerprint(fn: Callable | object, _seen: set | None = None) -> dict[str, Any]:
    """Describe ``fn`` for the content address: name, source and what it refers to.

    Module-level constants (numbers, strings, small tuples, numpy arrays) are included by value
    and user-defined helper functions by their own fingerprint; modules (``np``) and functions
    from installed libraries are included by name only.
    """
    _seen = set() if _seen is None else _seen
    target = inspect.unwrap(cast(Callable, fn))   # follows __wrapped__ on any object (a reducer too)
    if not isinstance(target, types.FunctionType):
        # Anything but a plain function is described by what it *is*, not by its type's name
        # alone: two bound methods, two builtins or two partials never share an address.
        return _callable_fingerprint(target, _seen)
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


def _callable_fingerprint(target: Any, _seen: set) -> dict[str, Any]:
    """The fingerprint of a callable that is not a plain function (see :func:`pipeline_fingerprint`)."""
    if isinstance(target, functools_partial_type()):
        return {"partial": pipeline_fingerprint(target.func, _seen),
                "args": [_state_fingerprint(a, "partial argument") for a in target.args],
                "kwargs": {k: _state_fingerprint(v, f"partial keyword {k!r}")
                           for k, v in sorted(target.keywords.items())}}
    if isinstance(target, types.MethodType):            # a bound method: its function and its instance
        return {"method": pipeline_fingerprint(target.__func__, _seen),
                "self": _state_fingerprint(target.__self__, f"the instance of {target.__func__.__qualname__}")}
    if isinstance(target, np.ufunc):
        return {"ufunc": f"numpy.{target.__name__}"}
    if isinstance(target, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                           types.ClassMethodDescriptorType, types.MethodWrapperType)):
        owner = getattr(target, "__self__", None)
        name = f"{getattr(target, '__module__', None) or type(owner).__module__}.{target.__qualname__}"
        if owner is None or isinstance(owner, (types.ModuleType, type)):   # len, math.sin, dict.fromkeys, str.upper
            return {"builtin": name}
        # A builtin bound to an instance (``d.update``, ``arr.sum``): the instance is part of it.
        return {"builtin": name, "self": _state_fingerprint(owner, f"the object {name} is bound to")}
    if isinstance(target, type):                       # a class used as the pipeline
        return {"class": f"{target.__module__}.{target.__qualname__}", "methods": _methods(target, _seen)}
    # A callable instance or a reducer: its class's code and its own state.
    cls = type(target)
    what = f"the {cls.__qualname__} instance"
    state = _object_state(target, what)
    return {"qualname": cls.__qualname__, "methods": _methods(cls, _seen),
            "state": {k: _state_fingerprint(v, what, 1, frozenset({id(target)})) for k, v in sorted(state.items())}}


def _object_state(value: Any, what: str) -> dict[str, Any]:
    """``vars()`` plus ``__slots__`` of an object ({} for an object with neither)."""
    from ..exceptions import InputError

    state: dict[str, Any] = dict(vars(value)) if hasattr(value, "__dict__") else {}
    for klass in type(value).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                state[name] = getattr(value, name)
    if not all(isinstance(k, str) for k in state):
        raise InputError("pipeline", what, "an object whose attributes have string names", where="content address")
    return state


def _methods(cls: type, _seen: set) -> dict[str, Any]:
    """Fingerprints of the plain functions a class (and its user-defined bases) defines."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or _is_installed_module(klass.__module__ or ""):
            continue
        for name, value in vars(klass).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, types.FunctionType) and id(value) not in _seen:
                out[f"{klass.__qualname__}.{name}"] = pipeline_fingerprint(value, _seen)
    return out


def _state_fingerprint(value: Any, what: str, _depth: int = 0, _ids: frozenset = frozenset()) -> Any:
    """An exact description of a value a pipeline carries (an instance's state, a partial's args).

    Numbers, strings, arrays, containers of them and objects made of them (by class name and
    ``vars()``) are described by value; functions by :func:`pipeline_fingerprint`. Anything
    else has no stable description, and would let two different jobs share one address: it
    is refused with an :class:`~dask_research.exceptions.InputError`.
    """
    from ..exceptions import InputError

    if isinstance(value, (bool, int, str, type(None))):
        return value
    if isinstance(value, float):
        return {"float": value.hex()} if value != value or value in (math.inf, -math.inf) else value
    if isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype.kind in "biufcSU":
        arr = np.asarray(value)
        return {"ndarray": hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest(),
                "dtype": arr.dtype.str, "shape": list(arr.shape)}
    if _depth > 8 or id(value) in _ids:
        raise InputError("pipeline", what, "state nested less than 8 levels deep, without cycles "
                         "(or pass a plain function)", where="content address")
    ids = _ids | {id(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_state_fingerprint(v, what, _depth + 1, ids) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _state_fingerprint(v, what, _depth + 1, ids) for k, v in sorted(value.items())}}
    if isinstance(value, types.FunctionType):
        return {"function": pipeline_fingerprint(value)}
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if callable(value) and not hasattr(value, "__dict__") and not isinstance(value, type):
        return {"callable": pipeline_fingerprint(value)}
    if isinstance(value, type):
        return {"class": f"{value.__module__}.{value.__qualname__}"}
    has_state = hasattr(value, "__dict__") or any(getattr(k, "__slots__", ()) for k in type(value).__mro__)
    if not has_state or type(value).__module__ == "builtins":
        raise InputError("pipeline", what, f"state the content address can describe: numbers, strings, numeric "
                         f"arrays, lists, tuples, dicts and objects of them (found a {type(value).__qualname__}); "
                         "or pass a plain function", where="content address")
    state = _object_state(value, what)
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}",
            "state": {k: _state_fingerprint(v, what, _depth + 1, ids) for k, v in sorted(state.items())}}


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
