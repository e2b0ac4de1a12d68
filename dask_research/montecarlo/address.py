"""Content addresses: a sha256 over a canonical JSON description of a job.

A pipeline is described by *what it computes*, the same wherever it was defined (a script, a
``python -i`` console, a notebook cell, an imported module, a ``--job FILE:JOB`` file):

- its code object: its instructions (constants by value, nested code objects such as a
  comprehension, a lambda or an inner function by their own digest, sets in a fixed order,
  names by name, jumps and the exception table by instruction index), its argument structure
  and the flags that change what the code is (generator, coroutine, ``*args``, ``**kwargs``).
  Not the file name, the line numbers or column positions, ``NOP`` instructions, the compiler's
  ``__future__`` flags (their effect is in the instructions), the docstring (no instruction
  loads it; ``python -OO`` strips it) nor whether a module the code calls into was imported in
  the same compilation unit (see :func:`_operations`): moving a function down its file or
  editing a comment or its docstring keeps its address, a one-token change in its body does not.
  ``python -O`` strips ``assert`` statements (and ``if __debug__:`` blocks) from the bytecode:
  a pipeline that has any is another job under ``-O``;
- its qualified name, its defaults (positional and keyword-only) by value;
- what it reads: the globals its code (and its nested code) loads and the variables it closes
  over; helper functions by their own description, recursively; numbers, strings, small tuples
  and numpy arrays by value; modules and library functions by name. Classes, instances, bound
  methods, partials and reducers are described by their code and their state
  (:func:`pipeline_fingerprint`). The name of a user's module (``__main__``, ``mymodule``) is
  never part of it, only that of an installed library (``numpy.tanh``).

Bytecode belongs to one Python minor version: the job's description records it
(``"address": {"scheme": 2, "bytecode": "cpython-311"}``), so a new Python minor version, like
a new numpy, is a new run id (computed afresh, to the same bits).

Scheme 1 (stores written before) described a function by its *source text* when
``inspect.getsource`` could find it (by its bytecode where not), so the same text typed into a
console had another id than in a file, and a comment edit gave a new one. It is still computed (``pipeline_fingerprint(fn, scheme=1)``,
``Job.describe(scheme=1)``) to check a job against an old run's manifest: ``show``,
``replay`` and ``verify`` (with ``job=``) work on those runs as before; running the job again
gives a scheme-2 id, a new run.

Examples
--------
>>> from dask_research.montecarlo.address import canonical_json, sha256_hex
>>> canonical_json({"b": 1, "a": [1.5, "x"]})
'{"a":[1.5,"x"],"b":1}'
>>> len(sha256_hex({"a": 1}))
64
>>> f = eval("lambda a: a * 2  # a comment")
>>> g = eval("(\\n  lambda a:\\n    a * 2)")
>>> pipeline_fingerprint(f) == pipeline_fingerprint(g) != pipeline_fingerprint(eval("lambda a: a * 3"))
True
"""
from __future__ import annotations

import bisect
import builtins
import dis
import hashlib
import inspect
import json
import math
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any, cast

import numpy as np

__all__ = ["canonical_json", "sha256_hex", "pipeline_fingerprint", "code_identity", "SCHEME", "SCHEMES", "BYTECODE",
           "address_header", "scheme_of"]

#: The content-address scheme new jobs are described with (see the module's docstring).
SCHEME = 2
#: Every scheme this version can describe a job with (1: source text; 2: code objects).
SCHEMES = (1, 2)
#: The bytecode a scheme-2 address depends on: the Python implementation and minor version.
BYTECODE: str = sys.implementation.cache_tag or f"{sys.implementation.name}-{sys.version_info[0]}{sys.version_info[1]}"

#: Code flags that change what a code object is; the others (``__future__`` features, nesting,
#: docstring presence) are the compiler's bookkeeping and not part of a scheme-2 address.
_KEPT_FLAGS = (inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS | inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
               | inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
               | inspect.CO_ASYNC_GENERATOR)
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_CONST_OPS = frozenset(dis.hasconst)
_NAMED_OPS = frozenset(dis.hasname) | frozenset(dis.haslocal) | frozenset(dis.hasfree)
_JUMP_OPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs) | frozenset(getattr(dis, "hasjump", ()))
_SKIPPED_OPS = frozenset({"NOP", "EXTENDED_ARG", "CACHE"})
_SAME_OP = {"LOAD_METHOD": "LOAD_ATTR"}      # see _operations


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace and exact (round-trip) floats."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)


def sha256_hex(obj: Any) -> str:
    """sha256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def address_header() -> dict[str, Any]:
    """What a scheme-2 job description records about its address: the scheme and the bytecode.

    >>> address_header()["scheme"], address_header()["bytecode"] == BYTECODE
    (2, True)
    """
    return {"scheme": SCHEME, "bytecode": BYTECODE}


def scheme_of(description: Any, where: str) -> int:
    """The scheme a stored job description was written with: 1 when it has no ``"address"``.

    A scheme this version does not know is a :class:`~dask_research.exceptions.StoreError`
    naming ``where``.

    >>> scheme_of({"pipeline": {}}, "manifest.json"), scheme_of({"address": address_header()}, "manifest.json")
    (1, 2)
    >>> scheme_of({"address": {"scheme": 9}}, "manifest.json")
    Traceback (most recent call last):
    ...
    dask_research.exceptions.StoreError: manifest.json: uses content-address scheme 9; this version of dask_research knows 1, 2 (a newer version wrote it)
    """
    from ..exceptions import StoreError

    if not isinstance(description, dict) or "address" not in description:
        return 1
    header = description["address"]
    scheme = header.get("scheme") if isinstance(header, dict) else None
    if isinstance(scheme, bool) or scheme not in SCHEMES[1:]:
        raise StoreError(where, f"uses content-address scheme {scheme!r}; this version of dask_research knows "
                         f"{', '.join(map(str, SCHEMES))} (a newer version wrote it)")
    return cast(int, scheme)


def _check_scheme(scheme: Any) -> int:
    if isinstance(scheme, bool) or scheme not in SCHEMES:
        from ..exceptions import InputError

        raise InputError("scheme", scheme, f"one of {', '.join(map(str, SCHEMES))}", where="content address")
    return cast(int, scheme)


def _source(fn: Callable) -> tuple[str, str]:
    """Scheme 1: (kind, text): the dedented source, or the bytecode when no source exists."""
    try:
        return "source", textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return "bytecode", _code_digest(fn.__code__)


def _code_digest(code: types.CodeType) -> str:
    """Scheme 1's digest of a code object without source text: its bytecode, names and
    constants, with nested code objects (a comprehension, a lambda, an inner function) by their
    own digest and sets in a fixed order, never by a ``repr`` that holds a memory address or
    depends on string hashing (the same function typed into two consoles once got two addresses).

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


def _const_identity(c: Any) -> Any:
    """A constant of a code object, as JSON: code by its digest, containers element-wise (a
    frozenset sorted), scalars by type and exact ``repr`` (``-0.0`` is not ``0.0``)."""
    if isinstance(c, types.CodeType):
        return {"code": code_identity(c)}
    if isinstance(c, (tuple, frozenset)):
        parts = [_const_identity(x) for x in c]
        if isinstance(c, frozenset):
            parts.sort(key=canonical_json)
        return {type(c).__name__: parts}
    return [type(c).__name__, repr(c)]


def _operations(code: types.CodeType) -> tuple[list[Any], list[Any]]:
    """The instructions of ``code`` in a form that does not depend on where it was compiled.

    Each instruction is ``[opname, argument]`` with constants by value (so a constant no
    instruction loads, the docstring, is not part of it), names and variables by name, and
    jump targets and exception-table ranges by instruction index; ``NOP`` (a docstring's
    place under ``-OO``, a ``pass``) and ``EXTENDED_ARG`` are left out. A method call on a
    module-level name is one form: CPython compiles ``np.tanh(x)`` as ``LOAD_GLOBAL np + NULL;
    LOAD_ATTR tanh`` when ``import numpy as np`` is in the same compilation unit (a script, a
    module, the same notebook cell) and as ``LOAD_GLOBAL np; LOAD_METHOD tanh`` otherwise (a
    console, another cell): ``LOAD_METHOD`` is written ``LOAD_ATTR`` and the ``NULL`` bit of
    a name is dropped (the call that follows is the same).
    """
    kept = [ins for ins in dis.get_instructions(code) if ins.opname not in _SKIPPED_OPS]
    offsets = [ins.offset for ins in kept]

    def at(offset: int) -> int:
        return bisect.bisect_left(offsets, offset)

    ops: list[Any] = []
    for ins in kept:
        arg: Any = ins.arg
        if ins.opcode in _JUMP_OPS:
            arg = at(cast(int, ins.argval))
        elif ins.opcode in _CONST_OPS:
            arg = _const_identity(ins.argval)
        elif ins.opcode in _NAMED_OPS:
            arg = ins.argval
        ops.append([_SAME_OP.get(ins.opname, ins.opname), arg])
    table = [[at(e.start), at(e.end), at(e.target), e.depth, e.lasti]
             for e in getattr(dis.Bytecode(code), "exception_entries", ())]
    return ops, table


def code_identity(code: types.CodeType) -> str:
    """Scheme 2's sha256 of what a code object computes (see the module's docstring).

    >>> f = eval("lambda xs: [x * 2 for x in xs if x in {'a', 'b'}]")
    >>> g = compile("\\n\\n\\nh = lambda xs: [x * 2 for x in xs if x in {'b', 'a'}]", "elsewhere.py", "exec")
    >>> ns = {}; exec(g, ns)
    >>> code_identity(f.__code__) == code_identity(ns["h"].__code__) != code_identity((lambda xs: xs).__code__)
    True
    """
    ops, table = _operations(code)
    return sha256_hex({
        "ops": ops, "exceptions": table,
        "name": code.co_name, "varnames": list(code.co_varnames),
        "freevars": list(code.co_freevars), "cellvars": list(code.co_cellvars),
        "args": [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount],
        "flags": code.co_flags & _KEPT_FLAGS,
    })


def _global_names(code: types.CodeType, out: set[str] | None = None) -> set[str]:
    """The global names ``code`` and the code nested in it load or bind (not attribute names)."""
    out = set() if out is None else out
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            out.add(cast(str, ins.argval))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _global_names(c, out)
    return out


def _reads(fn: types.FunctionType) -> dict[str, Any]:
    """Scheme 2: the globals ``fn``'s code reads (builtins and unbound names left out) and the
    variables it closes over (an empty cell left out)."""
    names: dict[str, Any] = {}
    for name in _global_names(fn.__code__):
        if name in fn.__globals__:
            names[name] = fn.__globals__[name]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            names[name] = cell.cell_contents
        except ValueError:
            continue
    return names


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


def _name(obj: Any, fallback: str, scheme: int) -> str:
    """``module.qualname``; in scheme 2 a user's module (``__main__``, a script's, a job
    file's) is left out, so the same code has one name wherever it was defined."""
    if scheme == 1:
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', fallback)}"
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or fallback
    return qualname if not _is_installed_module(module) else f"{module}.{qualname}"


def pipeline_fingerprint(fn: Callable | object, _seen: set | None = None, *, scheme: int = SCHEME) -> dict[str, Any]:
    """Describe ``fn`` for the content address: name, code and what it refers to.

    Module-level constants (numbers, strings, small tuples, numpy arrays) are included by value
    and user-defined helper functions by their own fingerprint; modules (``np``) and functions
    from installed libraries are included by name only. ``scheme=1`` gives the description of
    stores written before scheme 2 (the source text where it can be found).

    >>> import numpy as np
    >>> sorted(pipeline_fingerprint(lambda a: np.tanh(a)))
    ['code', 'defaults', 'qualname', 'refs']
    >>> pipeline_fingerprint(np.tanh), pipeline_fingerprint(len, scheme=1)
    ({'ufunc': 'numpy.tanh'}, {'builtin': 'builtins.len'})
    """
    scheme = _check_scheme(scheme)
    _seen = set() if _seen is None else _seen
    target = inspect.unwrap(cast(Callable, fn))   # follows __wrapped__ on any object (a reducer too)
    if not isinstance(target, types.FunctionType):
        # Anything but a plain function is described by what it *is*, not by its type's name
        # alone: two bound methods, two builtins or two partials never share an address.
        return _callable_fingerprint(target, _seen, scheme)
    # The qualified name, not the module: the same file run as a script (__main__), imported,
    # or loaded by the CLI must give the same address.
    out: dict[str, Any] = {"qualname": target.__qualname__}
    if scheme == 1:
        kind, text = _source(target)
        out[kind] = text
    else:
        out["code"] = code_identity(target.__code__)
    out["defaults"] = [_value_fingerprint(v) for v in (target.__defaults__ or ())]
    if scheme >= 2 and target.__kwdefaults__:
        out["kwdefaults"] = {k: _value_fingerprint(v) for k, v in sorted(target.__kwdefaults__.items())}
    _seen.add(id(target))
    if scheme == 1:
        try:
            refs = inspect.getclosurevars(target)
        except (TypeError, ValueError):
            return out
        names = {**refs.globals, **refs.nonlocals}
    else:
        names = _reads(target)
    deps: dict[str, Any] = {}
    for name in sorted(names):
        value = names[name]
        if isinstance(value, types.ModuleType):
            deps[name] = {"module": value.__name__}
        elif isinstance(value, types.FunctionType) and _is_user_function(value, target):
            if id(value) not in _seen:
                deps[name] = pipeline_fingerprint(value, _seen, scheme=scheme)
        elif scheme >= 2 and isinstance(value, type) and not _is_installed_module(value.__module__ or ""):
            if id(value) not in _seen:       # a user's class: by its code, like a helper function
                _seen.add(id(value))
                deps[name] = {"class": value.__qualname__, "methods": _methods(value, _seen, scheme)}
        elif callable(value):
            deps[name] = {"callable": _name(value, name, scheme)}
        else:
            fp = _value_fingerprint(value)
            deps[name] = fp if fp is not None else {"type": type(value).__qualname__}
    if deps:
        out["refs"] = deps
    return out


def _callable_fingerprint(target: Any, _seen: set, scheme: int) -> dict[str, Any]:
    """The fingerprint of a callable that is not a plain function (see :func:`pipeline_fingerprint`)."""
    if isinstance(target, functools_partial_type()):
        return {"partial": pipeline_fingerprint(target.func, _seen, scheme=scheme),
                "args": [_state_fingerprint(a, "partial argument", scheme=scheme) for a in target.args],
                "kwargs": {k: _state_fingerprint(v, f"partial keyword {k!r}", scheme=scheme)
                           for k, v in sorted(target.keywords.items())}}
    if isinstance(target, types.MethodType):            # a bound method: its function and its instance
        return {"method": pipeline_fingerprint(target.__func__, _seen, scheme=scheme),
                "self": _state_fingerprint(target.__self__, f"the instance of {target.__func__.__qualname__}",
                                           scheme=scheme)}
    if isinstance(target, np.ufunc):
        return {"ufunc": f"numpy.{target.__name__}"}
    if isinstance(target, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                           types.ClassMethodDescriptorType, types.MethodWrapperType)):
        owner = getattr(target, "__self__", None)
        name = f"{getattr(target, '__module__', None) or type(owner).__module__}.{target.__qualname__}"
        if owner is None or isinstance(owner, (types.ModuleType, type)):   # len, math.sin, dict.fromkeys, str.upper
            return {"builtin": name}
        # A builtin bound to an instance (``d.update``, ``arr.sum``): the instance is part of it.
        return {"builtin": name, "self": _state_fingerprint(owner, f"the object {name} is bound to", scheme=scheme)}
    if isinstance(target, type):                       # a class used as the pipeline
        return {"class": _name(target, target.__qualname__, scheme), "methods": _methods(target, _seen, scheme)}
    # A callable instance or a reducer: its class's code and its own state.
    cls = type(target)
    what = f"the {cls.__qualname__} instance"
    state = _object_state(target, what)
    return {"qualname": cls.__qualname__, "methods": _methods(cls, _seen, scheme),
            "state": {k: _state_fingerprint(v, what, 1, frozenset({id(target)}), scheme=scheme)
                      for k, v in sorted(state.items())}}


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


def _methods(cls: type, _seen: set, scheme: int = SCHEME) -> dict[str, Any]:
    """Fingerprints of the plain functions a class (and its user-defined bases) defines."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or _is_installed_module(klass.__module__ or ""):
            continue
        for name, value in vars(klass).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, types.FunctionType) and id(value) not in _seen:
                out[f"{klass.__qualname__}.{name}"] = pipeline_fingerprint(value, _seen, scheme=scheme)
    return out


def _state_fingerprint(value: Any, what: str, _depth: int = 0, _ids: frozenset = frozenset(), *,
                       scheme: int = SCHEME) -> Any:
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
        return {type(value).__name__: [_state_fingerprint(v, what, _depth + 1, ids, scheme=scheme) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _state_fingerprint(v, what, _depth + 1, ids, scheme=scheme)
                         for k, v in sorted(value.items())}}
    if isinstance(value, types.FunctionType):
        return {"function": pipeline_fingerprint(value, scheme=scheme)}
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if callable(value) and not hasattr(value, "__dict__") and not isinstance(value, type):
        return {"callable": pipeline_fingerprint(value, scheme=scheme)}
    if isinstance(value, type):
        return {"class": _name(value, value.__qualname__, scheme)}
    has_state = hasattr(value, "__dict__") or any(getattr(k, "__slots__", ()) for k in type(value).__mro__)
    if not has_state or type(value).__module__ == "builtins":
        raise InputError("pipeline", what, f"state the content address can describe: numbers, strings, numeric "
                         f"arrays, lists, tuples, dicts and objects of them (found a {type(value).__qualname__}); "
                         "or pass a plain function", where="content address")
    state = _object_state(value, what)
    return {"type": _name(type(value), type(value).__qualname__, scheme),
            "state": {k: _state_fingerprint(v, what, _depth + 1, ids, scheme=scheme) for k, v in sorted(state.items())}}


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
