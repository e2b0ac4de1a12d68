"""Load dask-research defaults into ``dask.config`` under the ``research`` namespace, and read them.

Every keyword argument in the public API defaults to ``None`` and is read from here at call
time, so ``dask.config.set({"research.montecarlo.verify": 0})`` or a YAML file in
``~/.config/dask/`` changes behaviour without touching code.

:func:`resolve` is how the package reads a setting: the value given by the caller wins, and
only ``None`` means "read ``research.<key>``". (It is deliberately not called ``get``:
``dask.config.get(key, default)`` takes a *default* as its second argument, where this one
takes the caller's *value*.) What it reads is checked against ``research-schema.yaml``: a value
of the wrong type is a :class:`~dask_research.exceptions.ConfigError` naming the key, and a key
next to it that is no setting at all (a typo such as ``research.montecarlo.verfy``) is a
:class:`ConfigWarning`, once, with the closest setting's name.

Examples
--------
>>> import dask
>>> from dask_research.config import resolve
>>> resolve("montecarlo.bins")
256
>>> with dask.config.set({"research.montecarlo.bins": 64}):
...     resolve("montecarlo.bins")
64
>>> resolve("montecarlo.bins", 32)   # the caller's value wins
32
>>> with dask.config.set({"research.montecarlo.bins": "many"}):
...     resolve("montecarlo.bins")
Traceback (most recent call last):
...
dask_research.exceptions.ConfigError: config research.montecarlo.bins='many' is invalid; expected an integer (research-schema.yaml)
"""
from __future__ import annotations

import difflib
import os
import warnings
from functools import cache, lru_cache
from typing import Any

import dask
import yaml

from .exceptions import ConfigError

__all__ = ["resolve", "ConfigWarning", "defaults", "fn", "schema_fn"]

fn = os.path.join(os.path.dirname(__file__), "research.yaml")
schema_fn = os.path.join(os.path.dirname(__file__), "research-schema.yaml")

with open(fn) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)

_MISSING = object()

#: Sections whose keys are not dask-research's own (Dask settings passed through to the
#: embedded cluster): never called unknown.
_PASS_THROUGH = ("cluster.distributed",)

_TYPES: dict[str, tuple[type, ...]] = {"integer": (int,), "number": (int, float), "boolean": (bool,),
                                       "string": (str,), "null": (type(None),), "array": (list, tuple),
                                       "object": (dict,)}
_WORDS = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string",
          "null": "null", "array": "a list", "object": "a mapping"}


class ConfigWarning(UserWarning):
    """A ``research.*`` key that is no dask-research setting (it is ignored)."""


_warned: set[str] = set()
_looked: set[tuple[str, tuple]] = set()


@cache
def _known(parts: tuple[str, ...]) -> frozenset[str] | None:
    """The settings of section ``research.<parts>``, canonical names (``None``: not a section)."""
    props = (_node(parts) or {}).get("properties")
    return frozenset(_canon(k) for k in props) if props else None


@lru_cache(maxsize=1)
def _schema() -> dict:
    with open(schema_fn) as f:
        return yaml.safe_load(f)["properties"]["research"]


def _canon(name: str) -> str:
    return name.replace("_", "-")


@cache
def _node(parts: tuple[str, ...]) -> dict | None:
    """The schema of ``research.<parts>`` (``None``: not declared)."""
    node: dict = {"properties": _schema().get("properties", {})}
    for part in parts:
        props = node.get("properties") or {}
        found = props.get(part) or props.get(_canon(part))
        if not isinstance(found, dict):
            return None
        node = found
    return node


def _check_type(key: str, value: Any, node: dict) -> None:
    declared = node.get("type")
    if declared is None:
        return
    types = declared if isinstance(declared, list) else [declared]
    for t in types:
        kinds = _TYPES.get(t, ())
        if isinstance(value, kinds) and not (t in ("integer", "number") and isinstance(value, bool)):
            break
    else:
        raise ConfigError(key, value, " or ".join(_WORDS.get(t, str(t)) for t in types) + " (research-schema.yaml)")
    enum = node.get("enum")
    if enum is not None and value not in enum:
        raise ConfigError(key, value, "one of " + ", ".join(map(repr, enum)) + " (research-schema.yaml)")


def _warn_unknown_siblings(parts: tuple[str, ...]) -> None:
    """Warn (once each) about keys next to ``research.<parts>`` that are no setting."""
    section = ".".join(parts[:-1])
    if any(section == p or section.startswith(p + ".") for p in _PASS_THROUGH):
        return
    known = _known(parts[:-1])
    if known is None:
        return
    given: Any = dask.config.config.get("research", {})
    for part in parts[:-1]:
        given = given.get(part) if isinstance(given, dict) else None
    if not isinstance(given, dict):
        return
    names = tuple(given)
    if (section, names) in _looked:
        return                                      # these keys were looked at already
    _looked.add((section, names))
    for k in names:
        if not isinstance(k, str) or _canon(k) in known:
            continue
        full = f"research.{section + '.' if section else ''}{k}"
        if full in _warned:
            continue
        _warned.add(full)
        close = difflib.get_close_matches(_canon(k), sorted(known), n=1)
        hint = f" (did you mean research.{section + '.' if section else ''}{close[0]}?)" if close else ""
        warnings.warn(f"{full} is not a dask-research setting and is ignored{hint}", ConfigWarning, stacklevel=4)


def resolve(key: str, given: Any = None, default: Any = _MISSING) -> Any:
    """``given`` unless it is ``None``, else ``research.<key>`` from ``dask.config``, checked.

    With ``default``, a key missing from the configuration gives it (without, a missing key is
    Dask's ``KeyError``). The value read must have the type ``research-schema.yaml`` declares for
    it (:class:`~dask_research.exceptions.ConfigError` otherwise); keys next to it that are no
    setting get one :class:`ConfigWarning` each.
    """
    if given is not None:
        return given
    if "research" not in dask.config.config:
        # Something replaced dask.config wholesale (e.g. a test harness restoring a snapshot
        # taken before we were imported): put our defaults back.
        dask.config.update_defaults(defaults)
    if default is _MISSING:
        value = dask.config.get(f"research.{key}")
    else:
        value = dask.config.get(f"research.{key}", default=default)
        if value is default:
            return value
    parts = tuple(key.split("."))
    if not any(key == p or key.startswith(p + ".") for p in _PASS_THROUGH):
        node = _node(parts)
        if node is not None and node.get("type") != "object":
            _check_type(key, value, node)
    _warn_unknown_siblings(parts)
    return value
