"""Parsing the power policy's settings: a battery floor, a compute budget, an interval.

Each parser accepts what a person types on a command line or in YAML and raises an
:class:`~dask_research.exceptions.InputError` naming the value otherwise.

>>> from dask_research.montecarlo.power_parse import parse_battery_floor, parse_interval
>>> parse_battery_floor("30%"), parse_interval("250ms")
(0.3, 0.25)
"""
from __future__ import annotations

import math

from ..exceptions import InputError

__all__ = ["parse_battery_floor", "parse_budget", "parse_interval"]

_FLOOR_EXPECTED = ("a fraction between 0 and 1 (e.g. 0.3) or a percentage between 0% and "
                   "100% (e.g. '30%')")
_BUDGET_EXPECTED = ("a positive number of CPU-seconds (e.g. 3600) or a duration "
                    "(e.g. '1h', '90 minutes')")
_INTERVAL_EXPECTED = "a positive number of seconds (e.g. 5) or a duration (e.g. '5s')"


def parse_battery_floor(value: float | str | None, where: str | None = "PowerPolicy") -> float | None:
    """Return the battery floor as a fraction in ``[0, 1]``, or ``None`` (no floor).

    Accepts a fraction (``0.3``, ``"0.3"``) or a percentage string (``"30%"``).

    >>> parse_battery_floor("30%"), parse_battery_floor("0.3"), parse_battery_floor(None)
    (0.3, 0.3, None)
    >>> parse_battery_floor(30)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dask_research.exceptions.InputError: PowerPolicy: battery_floor=30 is invalid; expected a ...
    """
    if value is None:
        return None
    original = value
    scale = 1.0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            text, scale = text[:-1].strip(), 100.0
        try:
            value = float(text)
        except ValueError:
            raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where)
    fraction = float(value) / scale
    if not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0:
        raise InputError("battery_floor", original, _FLOOR_EXPECTED, where=where)
    return fraction


def _parse_seconds(name: str, value: float | str, expected: str, where: str | None) -> float:
    from dask.utils import parse_timedelta

    original = value
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                value = parse_timedelta(text, default="seconds")
            except (ValueError, KeyError, TypeError):
                raise InputError(name, original, expected, where=where) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(name, original, expected, where=where)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(name, original, expected, where=where)
    return seconds


def parse_budget(value: float | str | None, where: str | None = "PowerPolicy") -> float | None:
    """Return the compute budget in CPU-seconds, or ``None`` (no budget).

    >>> parse_budget(3600), parse_budget("3600"), parse_budget("1h"), parse_budget(None)
    (3600.0, 3600.0, 3600.0, None)
    """
    if value is None:
        return None
    return _parse_seconds("budget", value, _BUDGET_EXPECTED, where)


def parse_interval(value: float | str, where: str | None = "PowerPolicy") -> float:
    """Return the seconds between checks.

    >>> parse_interval(5), parse_interval("5s")
    (5.0, 5.0)
    """
    return _parse_seconds("interval", value, _INTERVAL_EXPECTED, where)
