"""Validation of the scheduler's keyword arguments: numbers, objectives, weights, thresholds.

Each function raises :class:`~dask_research.exceptions.InputError` naming the parameter, the
value and what would be valid.

Examples
--------
>>> from dask_research.experiments.options import parse_objectives, parse_weights
>>> parse_objectives({"accuracy": "max", "cost": "min"})
[('accuracy', 'max'), ('cost', 'min')]
>>> parse_weights({"accuracy": 3, "cost": 1}, {"accuracy": "max", "cost": "min"})
[3.0, 1.0]
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..exceptions import InputError

__all__ = ["number", "parse_objectives", "parse_weights", "parse_threshold"]


def number(name: str, value: Any, expected: str, ok: Callable[[float], bool]) -> float:
    """``value`` if it is a real number (not a bool) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise InputError(name, value, expected, where="IterationScheduler")
    return value


def parse_objectives(value: Any) -> list[tuple[str, str]] | None:
    """``{"acc": "max"}``, ``["acc", "cost"]`` or ``[("acc", "max"), ...]`` -> pairs."""
    if value is None:
        return None
    expected = ('a dict {name: "max" | "min"}, a list of names (all maximised) or a list of '
                '(name, "max" | "min") pairs, with at least two distinct names')
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        pairs = [(v, "max") if isinstance(v, str) else tuple(v) for v in value]
    else:
        raise InputError("objectives", value, expected, where="IterationScheduler")
    if (len(pairs) < 2 or any(len(p) != 2 or not isinstance(p[0], str) or p[1] not in
                              ("max", "min") for p in pairs)
            or len({p[0] for p in pairs}) != len(pairs)):
        raise InputError("objectives", value, expected, where="IterationScheduler")
    return [(str(a), str(b)) for a, b in pairs]


def parse_weights(weights: Any, objectives: Mapping[str, str] | None) -> list[float] | None:
    """Weights of the objectives (a dict keyed by them or a sequence in their order)."""
    if weights is None:
        return None
    if objectives is None:
        raise InputError("weights", weights, "None without objectives (weights apply to "
                         "vector rewards)", where="IterationScheduler")
    names = list(objectives)
    if isinstance(weights, Mapping):
        if set(weights) != set(names):
            raise InputError("weights", weights, f"a weight for each objective: {names}",
                             where="IterationScheduler")
        weights = [weights[n] for n in names]
    w = list(weights)
    if len(w) != len(names) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= 0 for x in w) or sum(w) <= 0:
        raise InputError("weights", weights, f"{len(names)} numbers >= 0, not all 0",
                         where="IterationScheduler")
    return [float(x) for x in w]


def parse_threshold(name: str, value: Any, objectives: Mapping[str, str] | None,
                    expected: str, ok: Callable[[float], bool]) -> float | dict[str, float]:
    """A number, or with objectives a dict of per-objective thresholds."""
    if isinstance(value, Mapping):
        if objectives is None or not value or not set(value) <= set(objectives):
            raise InputError(name, value, "a number, or with objectives a dict of "
                             f"per-objective thresholds ({list(objectives or [])})",
                             where="IterationScheduler")
        return {k: float(number(f"{name}[{k!r}]", v, expected, ok)) for k, v in value.items()}
    return float(number(name, value, expected, ok))
