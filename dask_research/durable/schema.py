"""Checking a decoded document against what its writer could have written, before it is used.

A file that passes its checksum may still have been written by someone hostile (the checksum
is recomputed) or by a bug: a count retyped to ``true``, a float at ``1e308``, a pid of
``-5``. A schema is a small tree of checkers (:class:`Int`, :class:`Float`, :class:`Str`,
:class:`Bool`, :class:`List`, :class:`Obj`, :class:`Maybe`, :class:`OneOf`, :class:`Any_`);
:func:`check` walks a value against one and returns it, or raises :class:`Invalid` naming where
in the document the first wrong value is, what it is, and what would be valid. Booleans are
never numbers here (JSON's ``true`` is not a count), and floats are finite unless a schema says
otherwise.

Examples
--------
>>> lease = Obj({"pid": Int(1, 2**31), "host": Str(max_len=255)}, optional={"note": Str()})
>>> check({"pid": 12, "host": "n1"}, lease)
{'pid': 12, 'host': 'n1'}
>>> check({"pid": True, "host": "n1"}, lease)
Traceback (most recent call last):
...
dask_research.durable.schema.Invalid: pid is True; expected a whole number in [1, 2147483648]
>>> check({"range": [0.0, float("nan")]}, Obj({"range": List(Float(), length=2)}))
Traceback (most recent call last):
...
dask_research.durable.schema.Invalid: range[1] is nan; expected a finite number
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Invalid", "Checker", "Int", "Float", "Str", "Bool", "List", "Obj", "Maybe", "OneOf", "Any_",
           "Where", "check"]


class Invalid(ValueError):
    """A value that its schema does not admit: ``where`` (a path in the document) and ``problem``."""

    def __init__(self, where: str, problem: str):
        self.where, self.problem = where, problem
        super().__init__(where, problem)

    def __str__(self) -> str:
        return f"{self.where} {self.problem}" if self.where else self.problem


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Checker:
    """One node of a schema: ``check(value, where)`` returns the value or raises :class:`Invalid`."""

    expected = "a value"

    def check(self, value: Any, where: str) -> Any:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def refuse(self, value: Any, where: str, expected: str | None = None) -> Invalid:
        return Invalid(where, f"is {_show(value)}; expected {expected or self.expected}")


class Int(Checker):
    """A whole number (never a boolean) in ``[lo, hi]``."""

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi
        bounds = (f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
                  else f" <= {hi}" if hi is not None else "")
        self.expected = f"a whole number{bounds}"

    def check(self, value: Any, where: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.refuse(value, where)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.refuse(value, where)
        return value


class Float(Checker):
    """A number (an int is accepted, never a boolean), finite unless ``finite=False``, in ``[lo, hi]``."""

    def __init__(self, lo: float | None = None, hi: float | None = None, finite: bool = True):
        self.lo, self.hi, self.finite = lo, hi, finite
        bounds = (f" in [{lo:g}, {hi:g}]" if lo is not None and hi is not None else f" >= {lo:g}"
                  if lo is not None else f" <= {hi:g}" if hi is not None else "")
        self.expected = f"a {'finite ' if finite else ''}number{bounds}"

    def check(self, value: Any, where: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.refuse(value, where)
        try:
            f = float(value)
        except OverflowError:                       # an int too large for a float
            raise self.refuse(value, where) from None
        if (self.finite and not math.isfinite(f)) or math.isnan(f):
            raise self.refuse(value, where)
        if (self.lo is not None and f < self.lo) or (self.hi is not None and f > self.hi):
            raise self.refuse(value, where)
        return value


class Str(Checker):
    """A string of at most ``max_len`` characters, matching ``pattern`` (a full match) if given."""

    def __init__(self, max_len: int = 4096, pattern: str | None = None):
        self.max_len, self.pattern = max_len, None if pattern is None else re.compile(pattern)
        self.expected = (f"a string of at most {max_len} characters"
                         + (f" matching {pattern!r}" if pattern is not None else ""))

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, str) or len(value) > self.max_len or (
                self.pattern is not None and self.pattern.fullmatch(value) is None):
            raise self.refuse(value, where)
        return value


class Bool(Checker):
    """``true`` or ``false``."""

    expected = "true or false"

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, bool):
            raise self.refuse(value, where)
        return value


class Any_(Checker):
    """Any JSON value (already bounded in depth by :func:`~.jsondoc.loads`)."""

    def check(self, value: Any, where: str) -> Any:
        return value


class Maybe(Checker):
    """``null``, or what ``inner`` admits."""

    def __init__(self, inner: Checker):
        self.inner = inner
        self.expected = f"null or {inner.expected}"

    def check(self, value: Any, where: str) -> Any:
        return None if value is None else self.inner.check(value, where)


class OneOf(Checker):
    """One of the given JSON values (compared by type and value: ``1`` is not ``true``)."""

    def __init__(self, *values: Any):
        self.values = values
        self.expected = "one of " + ", ".join(repr(v) for v in values)

    def check(self, value: Any, where: str) -> Any:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise self.refuse(value, where)
        return value


class List(Checker):
    """A list of what ``item`` admits, of ``length`` items (or at most ``max_len``)."""

    def __init__(self, item: Checker, length: int | None = None, max_len: int = 1_000_000):
        self.item, self.length, self.max_len = item, length, max_len
        n = f"{length}" if length is not None else f"at most {max_len:,}"
        self.expected = f"a list of {n} items, each {item.expected}"

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length) or (
                len(value) > self.max_len):
            raise self.refuse(value, where)
        for i, v in enumerate(value):
            self.item.check(v, f"{where}[{i}]")
        return value


class Obj(Checker):
    """An object with the ``required`` keys and perhaps the ``optional`` ones.

    ``extra``: what other keys may hold (``None``: no other key is admitted; a checker: any
    string key whose value it admits, up to ``max_keys`` keys in all).
    """

    def __init__(self, required: Mapping[str, Checker], optional: Mapping[str, Checker] | None = None,
                 extra: Checker | None = None, max_keys: int = 1_000_000):
        self.required, self.optional = dict(required), dict(optional or {})
        self.extra, self.max_keys = extra, max_keys
        self.expected = "an object" + (f" with {', '.join(map(repr, self.required))}" if self.required else "")

    def check(self, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise self.refuse(value, where)
        if len(value) > self.max_keys:
            raise Invalid(where, f"has {len(value):,} keys, more than the {self.max_keys:,} it may have")
        for key, checker in self.required.items():
            if key not in value:
                raise Invalid(where, f"has no {key!r} entry")
            checker.check(value[key], _join(where, key))
        for key, v in value.items():
            if key in self.required:
                continue
            other = self.optional.get(key, self.extra)
            if other is None:
                raise Invalid(where, f"has an unknown entry {_show(key)}")
            other.check(v, _join(where, key))
        return value


class Where(Checker):
    """A checker of one's own: ``fn(value)`` returns ``None`` if admitted, else what was expected."""

    def __init__(self, fn: Callable[[Any], str | None], expected: str = "a valid value"):
        self.fn, self.expected = fn, expected

    def check(self, value: Any, where: str) -> Any:
        problem = self.fn(value)
        if problem is not None:
            raise self.refuse(value, where, problem)
        return value


def _join(where: str, key: str) -> str:
    name = key if key.isidentifier() else repr(key)
    return f"{where}.{name}" if where else name


def check(value: Any, schema: Checker, where: str = "") -> Any:
    """``value`` if ``schema`` admits it; else :class:`Invalid` naming the first wrong value."""
    return schema.check(value, where)
