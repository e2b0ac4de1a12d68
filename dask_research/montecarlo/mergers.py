"""Property checks for merge functions, run before any pool uses them.

A merge that is not associative and commutative gives results that depend on the schedule;
a merge with a wrong identity corrupts resumed runs. :func:`check_merger` tries the laws on
real states (random pairs and triples, reversed folds, random tree shapes over shuffled
orders) and refuses a failing merge with :class:`~dask_research.exceptions.MergerError`
naming the law and showing the counter-example. Integer fields are compared exactly and float
fields within ``rtol``; states may be the built-in accumulators or a user's own dicts,
dataclasses, tuples, numbers and arrays.

Examples
--------
>>> from dask_research.montecarlo.mergers import check_merger
>>> states = [(1, 2.0), (3, 4.0), (2, 1.0)]                 # (count, mean)
>>> def good(a, b):
...     n = a[0] + b[0]
...     return (n, (a[0] * a[1] + b[0] * b[1]) / n)
>>> check_merger(good, states).laws["associative"] > 0
True
>>> def mean_of_means(a, b):                                 # plausible, and wrong
...     return (a[0] + b[0], (a[1] + b[1]) / 2)
>>> check_merger(mean_of_means, states)
Traceback (most recent call last):
...
dask_research.exceptions.MergerError: merger is not associative: ...
"""
from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config
from ..exceptions import MergerError

__all__ = ["check_merger", "MergerReport", "compare_states"]

_NO = object()


@dataclass
class MergerReport:
    """How many checks of each law passed."""

    laws: dict[str, int] = field(default_factory=dict)

    def count(self, law: str) -> None:
        self.laws[law] = self.laws.get(law, 0) + 1

    def __str__(self) -> str:
        return "merger passed: " + ", ".join(f"{k} x{v}" for k, v in self.laws.items())


def _fields(x: Any) -> list[tuple[str, Any]] | None:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x)]
    if isinstance(x, dict):
        return [(repr(k), v) for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(x, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(x)]
    return None


def compare_states(x: Any, y: Any, rtol: float, atol: float = 0.0, path: str = "state",
                   exact: bool = False) -> str | None:
    """Return ``None`` if ``x`` and ``y`` agree, else a sentence naming the first difference."""
    fx, fy = _fields(x), _fields(y)
    if fx is not None or fy is not None:
        if fx is None or fy is None or type(x) is not type(y) or [k for k, _ in fx] != [k for k, _ in fy]:
            return f"{path}: structure differs ({type(x).__name__} vs {type(y).__name__})"
        for (k, vx), (_, vy) in zip(fx, fy):
            sep = "" if k.startswith("[") else "."
            diff = compare_states(vx, vy, rtol, atol, f"{path}{sep}{k}", exact)
            if diff:
                return diff
        return None
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        ax, ay = np.asarray(x), np.asarray(y)
        if ax.shape != ay.shape:
            return f"{path}: shape {ax.shape} vs {ay.shape}"
        if exact or ax.dtype.kind in "iub" or ay.dtype.kind in "iub":
            if not np.array_equal(ax, ay, equal_nan=ax.dtype.kind == "f"):
                i = int(np.flatnonzero(ax.ravel() != ay.ravel())[0])
                return f"{path}[{i}]: {ax.ravel()[i]!r} vs {ay.ravel()[i]!r} (compared exactly)"
            return None
        if not np.allclose(ax, ay, rtol=rtol, atol=atol, equal_nan=True):
            bad = ~np.isclose(ax, ay, rtol=rtol, atol=atol, equal_nan=True)
            i = int(np.flatnonzero(bad.ravel())[0])
            return f"{path}[{i}]: {ax.ravel()[i]!r} vs {ay.ravel()[i]!r} (rtol={rtol:g})"
        return None
    if isinstance(x, (bool, int, np.integer)) and isinstance(y, (bool, int, np.integer)):
        return None if int(x) == int(y) else f"{path}: {x!r} vs {y!r} (compared exactly)"
    if isinstance(x, (float, np.floating, int, np.integer)) and isinstance(y, (float, np.floating, int, np.integer)):
        fx_, fy_ = float(x), float(y)
        if math.isnan(fx_) and math.isnan(fy_):
            return None
        if exact:
            return None if fx_ == fy_ else f"{path}: {fx_!r} vs {fy_!r} (compared exactly)"
        if fx_ == fy_ or math.isclose(fx_, fy_, rel_tol=rtol, abs_tol=atol):
            return None
        return f"{path}: {fx_!r} vs {fy_!r} (rtol={rtol:g})"
    try:
        same = bool(x == y)
    except Exception:
        same = False
    return None if same else f"{path}: {x!r} vs {y!r}"


def _short(x: Any, limit: int = 160) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _random_tree(merge: Callable, items: list, rng: random.Random):
    if len(items) == 1:
        return items[0]
    cut = rng.randint(1, len(items) - 1)
    return merge(_random_tree(merge, items[:cut], rng), _random_tree(merge, items[cut:], rng))


def _fold(merge: Callable, items: Sequence):
    acc = items[0]
    for s in items[1:]:
        acc = merge(acc, s)
    return acc


def check_merger(merge: Callable[[Any, Any], Any], states: Sequence[Any], *,
                 identity: Any = _NO, rtol: float | None = None, atol: float = 0.0,
                 trees: int = 8, seed: int = 0) -> MergerReport:
    """Check that ``merge`` is pure, commutative, associative and order-independent on ``states``.

    Parameters
    ----------
    merge : callable
        ``merge(a, b) -> state``.
    states : sequence
        At least three real states (e.g. accumulators of a pilot split into pieces).
    identity : state, optional
        The empty state; if given, ``merge(identity, s)`` and ``merge(s, identity)`` must equal
        ``s`` exactly.
    rtol, atol : float
        Tolerance for floating-point fields (default ``research.montecarlo.merger-rtol``).
    trees : int
        Random tree shapes (over shuffled orders) compared with the left fold.

    Raises
    ------
    MergerError
        Naming the law (``commutative``, ``associative``, ``order-independent``, ``an identity``,
        ``pure``) with the counter-example.
    """
    rtol = float(config.resolve("montecarlo.merger-rtol", rtol))
    states = list(states)
    if len(states) < 3:
        raise ValueError(f"check_merger needs at least 3 states to test associativity, got {len(states)}")
    report = MergerReport()
    rng = random.Random(seed)

    def fail(law: str, inputs: str, got: Any, want: Any, diff: str) -> None:
        raise MergerError(law, f"{inputs}: {_short(got)} != {_short(want)}", diff)

    # Purity: merging must not modify its operands (futures share them).
    a, b = states[0], states[1]
    a0, b0 = copy.deepcopy(a), copy.deepcopy(b)
    merge(a, b)
    for orig, now, name in ((a0, a, "a"), (b0, b, "b")):
        diff = compare_states(now, orig, rtol, atol, path=name, exact=True)
        if diff:
            raise MergerError("pure", f"merge(a, b) modified its operand {name}", diff)
    report.count("pure")

    if identity is not _NO:
        for i, s in enumerate(states):
            for got, form in ((merge(identity, s), f"merge(empty, s{i})"), (merge(s, identity), f"merge(s{i}, empty)")):
                diff = compare_states(got, s, rtol, atol, exact=True)
                if diff:
                    fail("an identity", f"{form} should be s{i}", got, s, diff)
                report.count("identity")

    n = len(states)
    pairs = [(i, (i + 1) % n) for i in range(n)] + [tuple(rng.sample(range(n), 2)) for _ in range(n)]
    for i, j in pairs:
        ab, ba = merge(states[i], states[j]), merge(states[j], states[i])
        diff = compare_states(ab, ba, rtol, atol)
        if diff:
            fail("commutative", f"merge(s{i}, s{j}) vs merge(s{j}, s{i})", ab, ba, diff)
        report.count("commutative")

    triples = [(i, (i + 1) % n, (i + 2) % n) for i in range(n)]
    triples += [(a, b, c) for a, b, c in (rng.sample(range(n), 3) for _ in range(n))]
    for i, j, k in triples:
        left = merge(merge(states[i], states[j]), states[k])
        right = merge(states[i], merge(states[j], states[k]))
        diff = compare_states(left, right, rtol, atol)
        if diff:
            fail("associative", f"merge(merge(s{i}, s{j}), s{k}) vs merge(s{i}, merge(s{j}, s{k}))",
                 left, right, diff)
        report.count("associative")

    reference = _fold(merge, states)
    rev = _fold(merge, states[::-1])
    diff = compare_states(rev, reference, rtol, atol)
    if diff:
        fail("order-independent", "fold of the reversed states vs fold in order", rev, reference, diff)
    report.count("reversed fold")
    for t in range(trees):
        order = list(range(n))
        rng.shuffle(order)
        got = _random_tree(merge, [states[i] for i in order], rng)
        diff = compare_states(got, reference, rtol, atol)
        if diff:
            fail("order-independent", f"random tree #{t} over order {order} vs fold in order",
                 got, reference, diff)
        report.count("random tree")
    return report
