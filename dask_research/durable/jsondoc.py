"""JSON in and out of the files the project writes: strict, bounded, never surprising.

:func:`dumps` writes what :func:`loads` reads back: compact, no ``NaN``/``Infinity`` (JSON has
none), nesting no deeper than :data:`MAX_DEPTH`. :func:`loads` refuses what the project never
writes before anything uses it: invalid UTF-8 or JSON, the non-standard constants ``NaN``,
``Infinity`` and ``-Infinity`` (and numbers such as ``1e400``, which would read as infinity),
integers of more than :data:`MAX_INT_DIGITS` digits, nesting deeper than ``max_depth`` (a state
nested 600 deep would otherwise reach ``RecursionError`` in the first recursive reader).
Every refusal is one :class:`Malformed` (a ``ValueError``) whose message says what was wrong;
:class:`~.files.Files` turns it into the capability's own error naming the file.

Examples
--------
>>> loads(dumps({"a": [1, 2.5, None]}))
{'a': [1, 2.5, None]}
>>> loads(b'{"x": NaN}')
Traceback (most recent call last):
...
dask_research.durable.jsondoc.Malformed: holds NaN, which is not JSON (the project never writes it)
>>> loads(b"[" * 100 + b"]" * 100)
Traceback (most recent call last):
...
dask_research.durable.jsondoc.Malformed: is nested more than 64 levels deep
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["Malformed", "loads", "dumps", "depth", "MAX_DEPTH", "MAX_INT_DIGITS"]

#: Deepest nesting of lists and objects a project file may have (its deepest, a Monte-Carlo
#: shard state of a user reducer, is a handful of levels; 64 leaves room for any honest one).
MAX_DEPTH = 64
#: Longest integer literal accepted (a 64-bit counter has 20 digits; a float's exact integer
#: part at most 309).
MAX_INT_DIGITS = 320


_CONTAINERS = (dict, list, tuple)


class Malformed(ValueError):
    """A document that is not one the project writes (the message says why)."""


def _constant(name: str) -> Any:
    raise Malformed(f"holds {name}, which is not JSON (the project never writes it)")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise Malformed(f"holds an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value - value != 0:        # a literal too large for a float (1e400) reads as infinity
        raise Malformed(f"holds the number {text[:40]}, too large for a float (it would read as infinity, "
                        "which the project never writes)")
    return value


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply ``obj`` nests lists, tuples and dicts, counted without recursion.

    Stops counting past ``limit`` (returns ``limit + 1``), so a hostile value costs at most one
    pass over what lies within the limit.

    >>> depth(1), depth([1, [2]]), depth({"a": {"b": []}})
    (0, 2, 3)
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, d = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        d += 1
        if d > deepest:
            deepest = d
            if deepest > limit:
                return deepest
        # A list of a million counts holds no container: its types are looked at once, at C speed.
        if any(issubclass(kind, _CONTAINERS) for kind in set(map(type, children))):
            stack.extend((c, d) for c in children if isinstance(c, _CONTAINERS))
    return deepest


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH, constants: bool = False) -> Any:
    """The JSON document ``raw``; :class:`Malformed` if it is not one the project could have written.

    ``constants=True`` admits ``NaN`` and ``Infinity`` (for documents only shown, never used,
    such as who holds a lease).
    """
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"is not UTF-8 text (byte {e.start}); the project's files are UTF-8 JSON") from None
    try:
        doc = json.loads(raw, parse_constant=None if constants else _constant, parse_int=_int,
                         parse_float=None if constants else _float)
    except Malformed:
        raise
    except RecursionError:
        raise Malformed(f"is nested more than {max_depth} levels deep") from None
    except ValueError as e:       # JSONDecodeError, and int() past Python's own digit limit
        raise Malformed(f"is not valid JSON ({e})") from None
    # The C parser recurses once per level up to Python's recursion limit (RecursionError,
    # caught above); what it parsed is measured once, without recursion, before anything
    # recursive (a decoder, a canonical encoder) walks it.
    if depth(doc, max_depth) > max_depth:
        raise Malformed(f"is nested more than {max_depth} levels deep")
    return doc


def dumps(obj: Any, max_depth: int = MAX_DEPTH, sort_keys: bool = False) -> bytes:
    """``obj`` as compact UTF-8 JSON; :class:`Malformed` for what :func:`loads` would refuse.

    ``sort_keys=True`` writes the canonical form (sorted keys, ASCII, exact floats): the bytes a
    signature is computed over, so a writer can sign what it writes without encoding it twice.

    >>> dumps({"b": 1, "a": [True, None]})
    b'{"b":1,"a":[true,null]}'
    >>> dumps({"x": float("inf")})
    Traceback (most recent call last):
    ...
    dask_research.durable.jsondoc.Malformed: cannot be written as JSON (Out of range float values are not JSON compliant...)
    """
    if depth(obj, max_depth) > max_depth:
        raise Malformed(f"is nested more than {max_depth} levels deep; it could not be read back")
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False, sort_keys=sort_keys).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise Malformed(f"cannot be written as JSON ({e})") from None
