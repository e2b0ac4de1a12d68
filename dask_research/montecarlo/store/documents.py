"""What a run store's documents may hold: the schemas a manifest, a shard file and result.json are checked against.

A store file that passes its checksum may still have been written by someone hostile (the
checksum recomputed) or by a bug: a ``range`` retyped to ``true``, a shard count of ``1e9``, a
mean of ``"x"``. Every decoded document is checked here (types, ranges, finiteness, with
:mod:`dask_research.durable.schema`) before any of it is used, so what is wrong is a
:class:`~dask_research.exceptions.StoreError` naming the file and the value, never a
``TypeError`` deep in a reader. The schemas admit every document this project has written
(fields added later are optional; unknown fields are ignored, never used).

Examples
--------
>>> from dask_research.durable import schema
>>> schema.check([0.0, 1.0], RANGE)
[0.0, 1.0]
>>> schema.check(True, MANIFEST.required["range"], "range")
Traceback (most recent call last):
...
dask_research.durable.schema.Invalid: range is True; expected a pair [lo, hi] of finite numbers with lo < hi
"""
from __future__ import annotations

import math
from typing import Any

from ...durable.schema import Any_, Bool, Checker, Float, Int, List, Maybe, Obj, OneOf, Str, Where
from ..philox import MAX_SHARDS
from ..run_settings import RECORD as SETTINGS_RECORD
from .layout import MANIFEST_FORMAT, RESULT_FORMAT, SHARDS_FORMAT

__all__ = ["MANIFEST", "SHARDS", "RESULT", "RANGE", "either"]

_HEX64 = r"[0-9a-f]{64}"
_TEXT = Str(max_len=100_000)
_NAME = Str(max_len=1000)


def either(*checkers: Checker, expected: str) -> Checker:
    """A value that one of ``checkers`` admits.

    >>> from dask_research.durable.schema import check
    >>> check(3, either(Int(), Str(), expected="a number or a string"))
    3
    """
    def problem(value: Any) -> str | None:
        for c in checkers:
            try:
                c.check(value, "")
                return None
            except ValueError:
                continue
        return expected

    return Where(problem, expected)


def _pair(value: Any) -> str | None:
    expected = "a pair [lo, hi] of finite numbers with lo < hi"
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        return expected
    try:
        lo, hi = float(value[0]), float(value[1])
    except OverflowError:          # an integer too large for a float
        return expected
    return None if math.isfinite(lo) and math.isfinite(hi) and lo < hi else expected


#: A histogram range: ``[lo, hi]``, finite, ``lo < hi``.
RANGE = Where(_pair, "a pair [lo, hi] of finite numbers with lo < hi")

_PARAM = either(Float(), List(Float(), max_len=100_000), List(List(Float(), max_len=10_000), max_len=10_000),
                expected="a finite number or a list of them")
_INPUT = Obj({"names": List(Str(max_len=200, pattern=r"[A-Za-z_][A-Za-z0-9_]*"), max_len=10_000),
              "kind": Str(max_len=100)}, extra=_PARAM)
_ACCUMULATE = Obj({}, optional={
    "bins": Int(1, 1 << 20),
    "range": either(RANGE, Obj({}, optional={"margin": Float(0.0)}, extra=Any_()),
                    expected="a pair [lo, hi] of finite numbers with lo < hi, or the pilot's rule"),
    "reducer": Any_()}, extra=Any_())
_JOB = Obj({
    "pipeline": Any_(),
    "inputs": List(_INPUT, max_len=10_000),
    "partitioning": Obj({"shards": Int(1, MAX_SHARDS - 1), "samples_per_shard": Int(1, 2**31)}, extra=Any_()),
    "seed": Int(0, 2**128 - 1),
    "accumulate": _ACCUMULATE,
}, optional={
    # content-address scheme 2 on (absent: scheme 1, a store written before); scheme_of refuses
    # a scheme this version does not know in one line
    "address": Obj({"scheme": Int(2), "bytecode": Str(max_len=200)}, extra=Any_()),
}, extra=Any_())

#: ``manifest.json`` (``dask-research-run/1``).
MANIFEST = Obj({
    "format": OneOf(MANIFEST_FORMAT),
    "run_id": Str(max_len=64, pattern=_HEX64),
    "job": _JOB,
    "range": Maybe(RANGE),
    "engine": Obj({"dask_research": Str(max_len=200), "numpy": Str(max_len=200), "bit_generator": Str(max_len=200)},
                  extra=Str(max_len=200)),
    "checksum": Str(max_len=64, pattern=_HEX64),
}, optional={
    "name": Maybe(_TEXT),
    "pilot": Maybe(Obj({}, extra=Any_())),
    "versions": Maybe(Obj({}, extra=Maybe(Str(max_len=200)))),
    "cpu_features": Maybe(List(Str(max_len=200), max_len=10_000)),
    "origin": Maybe(Obj({}, optional={"module": Maybe(_TEXT), "qualname": Maybe(_TEXT), "file": Maybe(_TEXT)},
                        extra=Any_())),
    "created": Maybe(_NAME),
}, extra=Any_())

#: A shard file (``dask-research-shards/1``); each state is checked by the decoder.
SHARDS = Obj({
    "format": OneOf(SHARDS_FORMAT),
    "run_id": Str(max_len=64, pattern=_HEX64),
    "states": Obj({}, extra=Any_()),
    "checksum": Str(max_len=64, pattern=_HEX64),
}, optional={"worker": Maybe(_TEXT), "written": Maybe(Float())}, extra=Any_())

_COUNT = Maybe(Int(0))
_NUMBER = Maybe(Float())
_INTERVAL = Maybe(List(Float(), length=2))
_CHECK = Obj({}, optional={"shard": Int(0), "producer": Maybe(_TEXT), "verifier": Maybe(_TEXT),
                           "same_worker": Bool(), "elsewhere": Bool(), "match": Bool()}, extra=Any_())
_VERIFICATION = Obj({}, optional={
    "checked": List(_CHECK), "mismatches": List(Any_()), "quarantined_workers": List(_TEXT),
    "reused_checked": List(Int(0)), "recomputed_shards": _COUNT, "checks": _COUNT, "checks_elsewhere": _COUNT,
    "elsewhere": Maybe(_NAME), "moved": _COUNT}, extra=Any_())

#: ``result.json`` (``dask-research-result/1``): a convenience copy, checked before it is shown.
RESULT = Obj({"format": OneOf(RESULT_FORMAT), "run_id": Str(max_len=64, pattern=_HEX64)}, optional={
    "name": Maybe(_TEXT), "shards": _COUNT, "samples_per_shard": _COUNT, "shards_per_task": _COUNT,
    "wall_seconds": _NUMBER,
    "workers": Maybe(either(Obj({}, extra=Int(0)), List(_TEXT),
                            expected="an object of worker -> shards, or a list of workers")),
    "verification": Maybe(_VERIFICATION), "computed_shards": _COUNT, "reused_shards": _COUNT,
    "speculated": Maybe(List(Any_())), "max_in_flight": _COUNT,
    "n": _COUNT, "mean": _NUMBER, "sd": _NUMBER, "stderr": _NUMBER, "skewness": _NUMBER, "kurtosis": _NUMBER,
    "min": _NUMBER, "max": _NUMBER, "mean_interval95": _INTERVAL, "output_interval95_percentile": _INTERVAL,
    "output_interval95_normal": _INTERVAL, "underflow": _COUNT, "overflow": _COUNT, "samples_per_second": _NUMBER,
    "linearized": Maybe(Obj({}, extra=Any_())), "state": Any_(), "store_writes": Maybe(Obj({}, extra=Any_())),
    "groups": Maybe(Obj({}, extra=Any_())),
    # The run's settings, as the run used them (written since issue 27; older results lack it).
    "settings": Maybe(SETTINGS_RECORD),
}, extra=Any_())
