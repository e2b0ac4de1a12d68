"""The settings of a Monte-Carlo run: one table, one object, validated once, recorded as itself.

Every setting of :func:`~.run.run` is one field of :class:`RunSettings`, declared with
:func:`setting`: its ``research.montecarlo.*`` key, what a valid value is, how the value is
kept, and, for the settings that are keywords of ``mc.run``, the entry of ``mc.run``'s
docstring. Everything else is built from the fields: :meth:`RunSettings.parse` (keywords +
``dask.config``: a keyword's value wins, ``None`` reads the config; a bad keyword is an
:class:`~dask_research.exceptions.InputError` naming it, a bad config value a
:class:`~dask_research.exceptions.ConfigError` naming its key, each checked once, before the
run does anything), ``mc.run``'s signature and the ``Parameters`` of its docstring
(:func:`run_signature`, :func:`parameters_doc`), and the record ``result.json`` keeps
(:meth:`RunSettings.record`, read back by :meth:`RunSettings.from_record`, checked by
:data:`RECORD`). The engine and its parts read this object, never ``dask.config``. Adding a
setting is one field here plus its line in ``research.yaml`` and ``research-schema.yaml``.

Examples
--------
>>> s = RunSettings.parse(verify=2, window=32)
>>> s.verify, s.window, s.store_writes, s.block_timeout
(2, 32, 'auto', 'auto')
>>> RunSettings.from_record(s.record()) == s
True
>>> RunSettings.parse(verify=-1)
Traceback (most recent call last):
...
dask_research.exceptions.InputError: run: verify=-1 is invalid; expected a non-negative number of shards
"""
from __future__ import annotations

import inspect
import math
import numbers
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .. import config
from ..durable import schema
from ..exceptions import ConfigError, InputError
from .verify import REUSED_EXPECTED, reused_setting

__all__ = ["RunSettings", "Setting", "setting", "RECORD", "KEYWORDS", "parameters_doc", "run_signature"]

#: The ``where`` of a keyword's error.
_WHERE = "run"

#: ``convert(value) -> the value kept``; raises ``TypeError``/``ValueError`` for a value it refuses.
Convert = Callable[[Any], Any]


@dataclass(frozen=True)
class Setting:
    """One row of the table: how one field of :class:`RunSettings` is read and checked.

    ``key`` is its ``research.montecarlo.*`` name (``None``: no config setting, the keyword's
    default is ``None``), ``expected`` what a valid value is (both errors say it), ``convert``
    the check that returns the value kept, ``doc`` its entry in ``mc.run``'s ``Parameters``
    (``None``: not a keyword of ``mc.run``, only a config setting).
    """

    key: str | None
    expected: str
    convert: Convert
    doc: str | None = None


def setting(key: str | None, expected: str, convert: Convert, doc: str | None = None) -> Any:
    """A field of :class:`RunSettings` declared by its row (see :class:`Setting`)."""
    return field(metadata={"setting": Setting(key, expected, convert, doc)})


# -- what a value may be (each refuses with TypeError or ValueError) ------------------------------

def _whole(lo: int) -> Convert:
    """A whole number >= ``lo`` (an integral float is accepted, a boolean never)."""
    def convert(v: Any) -> int:
        if isinstance(v, bool):
            raise TypeError(v)
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(v)
        n = int(v) if isinstance(v, float) else operator.index(v)
        if n < lo:
            raise ValueError(v)
        return n
    return convert


def _real(ok: Callable[[float], bool]) -> Convert:
    """A real number (never a boolean) for which ``ok`` holds (``NaN`` fails every comparison)."""
    def convert(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(v)
        f = float(v)
        if not ok(f):
            raise ValueError(v)
        return f
    return convert


def _optional(inner: Convert) -> Convert:
    def convert(v: Any) -> Any:
        return None if v is None else inner(v)
    return convert


def _flag(v: Any) -> bool:
    return bool(v)


def _choice(*options: str) -> Convert:
    def convert(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise ValueError(v)
        return v
    return convert


def _power_of_two(v: Any) -> int:
    n = _whole(1)(v)
    if n & (n - 1):
        raise ValueError(v)
    return n


def _duration(v: Any) -> float | str | None:
    """``None`` (no limit), ``"auto"``, or a positive duration in seconds (``90``, ``"90s"``)."""
    from dask.utils import parse_timedelta

    if v is None or (isinstance(v, str) and v == "auto"):
        return v
    if isinstance(v, bool):
        raise TypeError(v)
    seconds = parse_timedelta(v, default="seconds")
    if seconds is None or not seconds > 0:
        raise ValueError(v)
    return float(seconds)


def _positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def _non_negative(x: float) -> bool:
    return x >= 0 and math.isfinite(x)


_SECONDS = '"auto", a positive duration (seconds, or "90s", "5 minutes"), or null (no limit)'


@dataclass(frozen=True)
class RunSettings:
    """The validated settings of one run: one field per setting (see the module docstring).

    Built once by :meth:`parse` (or :meth:`from_record`); frozen, so the engine and its parts
    all read the same values. :meth:`for_cluster` fills in what depends on the cluster.
    """

    # -- keywords of mc.run --------------------------------------------------------------------
    verify: int = setting(
        "verify", "a non-negative number of shards", _whole(0),
        "int, optional\n    Shards recomputed on a different worker before the result is accepted (default\n"
        "    ``research.montecarlo.verify``; at least one shard of every producing worker is checked).")
    shards_per_task: int | None = setting(
        None, "a power of two (tasks compute aligned subtrees of the reduction tree)",
        _optional(_power_of_two),
        "int, optional\n    A power of two; default sized from the pilot so a task takes about\n"
        "    ``research.montecarlo.task-seconds``. Never changes the result's bits.")
    progress: bool = setting(
        "progress", "true or false", _flag,
        "bool, optional\n    Progress bar of accepted shards (default ``research.montecarlo.progress``).")
    check_merger: bool = setting(
        "check-merger", "true or false", _flag,
        "bool, optional\n    Property-check the reducer's merge on pilot states first\n"
        "    (default ``research.montecarlo.check-merger``).")
    speculate: float = setting(
        "speculate", "a number >= 0 of median block times (0 disables speculation)", _real(lambda x: x >= 0),
        "float, optional\n    Near the end, duplicate a block running longer than this many median block times\n"
        "    (default ``research.montecarlo.speculate``; 0 disables).")
    window: int | None = setting(
        "window", "a positive number of blocks, or None (8 per thread, at least 16)", _optional(_whole(1)),
        "int, optional\n    Blocks in flight at once (default ``research.montecarlo.window``; ``None``: 8 per\n"
        "    thread, at least 16).")
    # -- research.montecarlo.* only --------------------------------------------------------------
    verify_reused: int | str | None = setting("verify-reused", REUSED_EXPECTED, reused_setting)
    pipeline_attempts: int = setting("pipeline-attempts", "a positive number of workers", _whole(1))
    group_blocks: int = setting("group-blocks", "a positive number of blocks (1: no groups)", _whole(1))
    store_writes: str = setting("store-writes", '"auto" (the workers write when they can reach the store) '
                                'or "client"', _choice("auto", "client"))
    block_timeout: float | str | None = setting("block-timeout", _SECONDS, _duration)
    check_timeout: float | str | None = setting("check-timeout", _SECONDS, _duration)
    timeout_factor: float = setting("timeout-factor", "a positive number (of expected times)", _real(_positive))
    block_timeout_min: float = setting("block-timeout-min", "a number of seconds >= 0", _real(_non_negative))
    check_timeout_min: float = setting("check-timeout-min", "a number of seconds >= 0", _real(_non_negative))
    task_seconds: float = setting("task-seconds", "a positive number of seconds", _real(_positive))
    max_shards_per_task: int = setting("max-shards-per-task", "a positive number of shards", _whole(1))
    client_block_seconds: float = setting("client-block-seconds", "a non-negative number of seconds (0 sizes "
                                          "tasks by task-seconds alone)", _real(_non_negative))
    merger_rtol: float = setting("merger-rtol", "a relative tolerance >= 0", _real(_non_negative))
    finite_difference_step: float = setting("finite-difference-step", "a positive relative step",
                                            _real(_positive))
    lease_timeout: float = setting("lease-timeout", "a positive number of seconds", _real(_positive))
    lease_wait: float | None = setting("lease-wait", "a number of seconds >= 0, or null (as long as the holder "
                                       "lives)", _optional(_real(lambda x: x >= 0)))

    # -- building it -----------------------------------------------------------------------------
    @classmethod
    def parse(cls, **given: Any) -> RunSettings:
        """Settings from values by name (``None``: ``research.montecarlo.<key>``), each checked once.

        Any setting may be given (a test, a record); ``mc.run`` passes its keywords through
        :meth:`from_keywords`. An unknown name is an :class:`InputError` naming it.
        """
        unknown = sorted(set(given) - set(NAMES))
        if unknown:
            raise InputError(unknown[0], given[unknown[0]], "one of the run's settings: " + ", ".join(NAMES),
                             where=_WHERE)
        return cls(**{name: _read(name, row, given.get(name)) for name, row in ROWS.items()})

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any]) -> RunSettings:
        """:meth:`parse` of ``mc.run``'s keywords: a name that is no keyword of ``mc.run`` is refused."""
        unknown = sorted(set(given) - set(KEYWORDS))
        if unknown:
            raise InputError(unknown[0], given[unknown[0]], "one of mc.run's keywords: job, client, store, pilot, "
                             + ", ".join(KEYWORDS), where=_WHERE)
        return cls.parse(**given)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunSettings:
        """The settings a :meth:`record` holds, checked as keywords are (``None`` stays ``None``;
        a setting the record lacks, written before it existed, reads the config)."""
        schema.check(dict(record), RECORD, "settings")
        return cls(**{name: _keep(name, row, record[name]) if name in record else _read(name, row, None)
                      for name, row in ROWS.items()})

    def for_cluster(self, threads: int) -> RunSettings:
        """These settings with what ``None`` leaves to the cluster filled in: the window, 8
        blocks per thread (at least 16).

        >>> RunSettings.parse(window=None).for_cluster(threads=4).window
        32
        """
        return self if self.window is not None else replace(self, window=max(16, 8 * threads))

    def record(self) -> dict[str, Any]:
        """Every setting by name, as ``result.json`` records it (JSON scalars)."""
        return {name: getattr(self, name) for name in ROWS}


def _keep(name: str, row: Setting, value: Any, *, keyword: bool = True) -> Any:
    """``value`` as ``row`` keeps it; refused, a one-line error naming the keyword or the key."""
    try:
        return row.convert(value)
    except (TypeError, ValueError, KeyError, ArithmeticError):
        if keyword:
            raise InputError(name, value, row.expected, where=_WHERE) from None
        raise ConfigError(f"montecarlo.{row.key}", value, row.expected) from None


def _read(name: str, row: Setting, given: Any) -> Any:
    """The caller's value if it is not ``None``, else ``research.montecarlo.<key>``; kept by ``row``."""
    if given is not None or row.key is None:
        return _keep(name, row, given)
    try:
        value = config.resolve(f"montecarlo.{row.key}")
    except ConfigError as e:          # the schema's type check: say what a valid value is, in the row's words
        raise ConfigError(e.key, e.value, row.expected) from None
    return _keep(name, row, value, keyword=False)


#: The table: each setting's row, by field name, in declaration order.
ROWS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(RunSettings)}
NAMES = tuple(ROWS)
#: The settings that are keywords of ``mc.run``, in table order.
KEYWORDS = tuple(name for name, row in ROWS.items() if row.doc is not None)
#: What ``result.json``'s ``settings`` may hold: JSON scalars by name (a newer version's settings too).
RECORD = schema.Obj({}, extra=schema.Maybe(schema.Where(
    lambda v: None if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256) else
    "a number, true, false, null or a short string")), max_keys=256)


def parameters_doc() -> str:
    """The ``Parameters`` entries of ``mc.run``'s keyword settings, in table order."""
    return "\n".join(f"{name} : {ROWS[name].doc}" for name in KEYWORDS)


def run_signature(func: Callable) -> inspect.Signature:
    """``func``'s signature with its ``**settings`` replaced by one keyword per keyword setting
    (and without a ``*args`` kept only for a deprecated call form).

    >>> def run(job, *, store=None, **settings): ...
    >>> list(run_signature(run).parameters)
    ['job', 'store', 'verify', 'shards_per_task', 'progress', 'check_merger', 'speculate', 'window']
    """
    sig = inspect.signature(func)
    P = inspect.Parameter
    params = [p for p in sig.parameters.values() if p.kind not in (P.VAR_KEYWORD, P.VAR_POSITIONAL)]
    params += [P(name, P.KEYWORD_ONLY, default=None) for name in KEYWORDS]
    return sig.replace(parameters=params)
