"""Fixed-size shard accumulators and the reducer interface.

:class:`Moments` holds count, mean, central sums M2..M4 (Chan et al.; Pébay 2008), min, max
and a histogram on frozen edges with underflow and overflow counters: about 2 KiB at 256 bins,
whatever the number of samples. :func:`merge_moments` combines two of them; the empty
accumulator is an exact identity, and the merge is exactly commutative (operands are put in a
canonical order first), so a fixed tree of merges gives the same bits for any schedule.

A user may declare their own reducer: any object with ``init()``, ``update(state, y)``,
``merge(a, b)`` and ``finalize(state)`` (see :class:`Reducer`); its merge is property-checked
before a pool uses it.

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.accumulators import Moments, merge_moments
>>> y = np.arange(10.0)
>>> a = Moments.from_samples(y[:4], (0.0, 10.0), 5)
>>> b = Moments.from_samples(y[4:], (0.0, 10.0), 5)
>>> m = merge_moments(a, b)
>>> m.n, m.mean, m.hist.tolist()
(10, 4.5, [0, 2, 2, 2, 2, 2, 0])
>>> merge_moments(m, Moments.empty((0.0, 10.0), 5)) is m
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Moments", "merge_moments", "Reducer", "MomentsReducer"]


@dataclass(frozen=True, eq=False)
class Moments:
    """Count, moments, extremes and a frozen-edge histogram of a set of samples.

    ``hist`` has ``bins + 2`` int64 counters: ``hist[0]`` underflow (``y < lo``), ``hist[1:-1]``
    the bins ``[e_i, e_{i+1})``, ``hist[-1]`` overflow (``y >= hi``).
    """

    n: int
    mean: float
    m2: float
    m3: float
    m4: float
    min: float
    max: float
    lo: float
    hi: float
    hist: np.ndarray

    @classmethod
    def empty(cls, range: tuple[float, float], bins: int) -> Moments:
        """The identity of :func:`merge_moments`."""
        return cls(0, 0.0, 0.0, 0.0, 0.0, math.inf, -math.inf, float(range[0]), float(range[1]),
                   np.zeros(bins + 2, dtype=np.int64))

    @classmethod
    def from_samples(cls, y: np.ndarray, range: tuple[float, float], bins: int) -> Moments:
        """Accumulate a 1-d float array (finite values; checked by the caller)."""
        n = int(y.size)
        lo, hi = float(range[0]), float(range[1])
        if n == 0:
            return cls.empty((lo, hi), bins)
        mean = float(np.sum(y) / n)
        d = y - mean
        d2 = d * d
        m2 = float(np.sum(d2))
        d *= d2                      # d**3
        m3 = float(np.sum(d))
        d2 *= d2                     # d**4
        m4 = float(np.sum(d2))
        # Histogram by index arithmetic + bincount: same bins as [e_i, e_{i+1}), faster than
        # np.histogram; out-of-range values land in the two outer counters.
        t = y - lo
        t *= bins / (hi - lo)
        np.floor(t, out=t)
        np.clip(t, -1.0, float(bins), out=t)
        t += 1.0
        hist = np.bincount(t.astype(np.intp), minlength=bins + 2).astype(np.int64)
        return cls(n, mean, m2, m3, m4, float(y.min()), float(y.max()), lo, hi, hist)

    @property
    def bins(self) -> int:
        return int(self.hist.size - 2)

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, self.bins + 1)

    @property
    def nbytes(self) -> int:
        """Bytes held: 9 scalars of 8 bytes plus the histogram."""
        return 9 * 8 + int(self.hist.nbytes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Moments):
            return NotImplemented
        scal = ("n", "mean", "m2", "m3", "m4", "min", "max", "lo", "hi")
        return all(_same(getattr(self, k), getattr(other, k)) for k in scal) and np.array_equal(
            self.hist, other.hist)

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; floats as exact hex strings, so a round trip keeps every bit."""
        out: dict[str, Any] = {"n": self.n}
        for k in ("mean", "m2", "m3", "m4", "min", "max", "lo", "hi"):
            out[k] = float(getattr(self, k)).hex()
        out["hist"] = self.hist.tolist()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Moments:
        """Inverse of :meth:`to_dict`; the result is :meth:`check`-ed (a stored state is untrusted)."""
        if not isinstance(d, dict):
            raise ValueError(f"an accumulator is a dict, not a {type(d).__name__}")
        n = d["n"]
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"count n={n!r} is not an integer")
        f = {k: float.fromhex(d[k]) for k in ("mean", "m2", "m3", "m4", "min", "max", "lo", "hi")}
        hist = d["hist"]
        if not isinstance(hist, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in hist):
            raise ValueError("histogram is not a list of integer counts")
        return cls(n, hist=np.asarray(hist, dtype=np.int64), **f).check()

    def check(self) -> Moments:
        """Raise ``ValueError`` unless the accumulator is one that samples could have produced.

        n >= 0; finite mean and central sums with M2 >= 0 and M4 >= 0 (M3, M4 may be infinite
        only where ``n (max - min)^k`` overflows, as a real sum then does); lo < hi finite; a 1-d
        histogram of at least 3 non-negative counters (underflow, bins, overflow), each at most
        n, adding up to n (exactly, in Python integers); min <= max (finite) when n > 0, with
        the bounds samples in ``[min, max]`` imply (see :meth:`_bounds`: the mean inside, M2..M4
        bounded, the histogram's outer non-empty bins those of min and max); and the exact
        empty state when n == 0.
        """
        problems = []
        if self.n < 0:
            problems.append(f"count n={self.n} is negative")
        moments = {k: getattr(self, k) for k in ("mean", "m2", "m3", "m4")}
        width = self.max - self.min if self.n > 0 else 0.0

        def overflows(k: int) -> bool:   # |M_k| <= n (max - min)^k: a real sum can overflow only then
            with np.errstate(over="ignore"):
                return math.isinf(float(np.float64(self.n) * np.float64(width) ** k)) if math.isfinite(width) else True

        bad = [k for k, v in moments.items() if math.isnan(v) or (math.isinf(v) and not (
            k in ("m3", "m4") and overflows(int(k[1])) and (k == "m3" or v > 0)))]
        if bad:
            problems.append(f"non-finite {', '.join(f'{k}={moments[k]!r}' for k in bad)}")
        for k in ("m2", "m4"):
            if math.isfinite(moments[k]) and moments[k] < 0:
                problems.append(f"{k}={moments[k]!r} is negative (a sum of even powers)")
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            problems.append(f"histogram range [{self.lo!r}, {self.hi!r}) is not finite lo < hi")
        hist = self.hist
        if hist.ndim != 1 or hist.size < 3:
            problems.append(f"histogram has shape {hist.shape}; expected underflow, bins, overflow")
        elif (hist < 0).any():
            problems.append("histogram has negative counts")
        elif (hist > self.n).any() or sum(hist.tolist()) != self.n:   # Python ints: an int64 sum can wrap
            problems.append(f"histogram counts + underflow + overflow = {sum(hist.tolist()):,}, not n = {self.n:,}")
        if self.n > 0 and not (math.isfinite(self.min) and math.isfinite(self.max) and self.min <= self.max):
            problems.append(f"min={self.min!r} and max={self.max!r} are not finite min <= max")
        elif self.n > 0 and not problems:
            problems.extend(self._bounds())
        if self.n == 0 and (self.mean, self.m2, self.m3, self.m4) != (0.0, 0.0, 0.0, 0.0):
            problems.append("an empty accumulator (n=0) has non-zero moments")
        if problems:
            raise ValueError("invalid accumulator: " + "; ".join(problems))
        return self

    def _bounds(self) -> list[str]:
        """What samples in ``[min, max]`` imply, for a non-empty accumulator with finite extremes.

        ``min <= mean <= max``; ``M2 <= n (max - min)^2 / 4`` (Popoviciu), ``|M3| <= n (max -
        min)^3``, ``M4 <= n (max - min)^4``, each with a rounding allowance; and the histogram's
        first and last non-empty counters are those ``min`` and ``max`` fall in (the bin rule
        of :meth:`from_samples`, so exact).
        """
        out = []
        n, lo_v, hi_v = self.n, self.min, self.max
        # Rounding allowance: the computed mean may sit a few ulps of max|y| off the true mean.
        tol = 1e-9 * max(abs(lo_v), abs(hi_v)) + 1e-300
        if not (lo_v - tol <= self.mean <= hi_v + tol):
            out.append(f"mean={self.mean!r} is outside [min, max] = [{lo_v!r}, {hi_v!r}]")
        half = (hi_v - lo_v) / 2 + tol
        with np.errstate(over="ignore"):
            limits = {"m2": float(np.float64(n) * np.float64(half) ** 2),
                      "m3": float(np.float64(n) * np.float64(2 * half) ** 3),
                      "m4": float(np.float64(n) * np.float64(2 * half) ** 4)}
        for k, limit in limits.items():
            v = getattr(self, k)
            if math.isfinite(v) and math.isfinite(limit) and abs(v) > limit * (1 + 1e-9):
                out.append(f"{k}={v!r} exceeds {limit:.6g}, the most {n:,} samples in [{lo_v!r}, {hi_v!r}] can give")
        nz = np.flatnonzero(self.hist)
        if nz.size:
            first, last = self._counter_of(lo_v), self._counter_of(hi_v)
            if int(nz[0]) != first or int(nz[-1]) != last:
                out.append(f"histogram's non-empty counters {int(nz[0])}..{int(nz[-1])} do not match min={lo_v!r} "
                           f"and max={hi_v!r} (counters {first}..{last})")
        return out

    def _counter_of(self, v: float) -> int:
        """The histogram counter (0 underflow, 1..bins, bins+1 overflow) a sample ``v`` goes to."""
        bins = self.bins
        t = np.array([v], dtype=np.float64) - self.lo
        t *= bins / (self.hi - self.lo)
        np.floor(t, out=t)
        np.clip(t, -1.0, float(bins), out=t)
        return int(t[0]) + 1


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Combine two accumulators (Pébay 2008, eqs. 3.1 and 3.2 for M3, M4).

    Exactly commutative (a canonical operand order is used), exact identity for empty
    operands, associative up to rounding. Histograms must share edges.
    """
    if a.lo != b.lo or a.hi != b.hi or a.hist.size != b.hist.size:
        raise ValueError(
            f"cannot merge histograms with different edges: [{a.lo}, {a.hi}) x {a.bins} "
            f"and [{b.lo}, {b.hi}) x {b.bins}")
    if b.n == 0:
        return a
    if a.n == 0:
        return b
    # Canonical order makes merge(a, b) and merge(b, a) the same bits.
    if (b.n, b.mean, b.m2, b.m3, b.m4) < (a.n, a.mean, a.m2, a.m3, a.m4):
        a, b = b, a
    na, nb = float(a.n), float(b.n)
    n = na + nb
    delta = b.mean - a.mean
    dn = delta / n
    mean = a.mean + dn * nb
    m2 = a.m2 + b.m2 + delta * dn * na * nb
    m3 = (a.m3 + b.m3 + delta * dn * dn * na * nb * (na - nb)
          + 3.0 * dn * (na * b.m2 - nb * a.m2))
    m4 = (a.m4 + b.m4 + delta * dn * dn * dn * na * nb * (na * na - na * nb + nb * nb)
          + 6.0 * dn * dn * (na * na * b.m2 + nb * nb * a.m2)
          + 4.0 * dn * (na * b.m3 - nb * a.m3))
    return Moments(a.n + b.n, mean, m2, m3, m4, min(a.min, b.min), max(a.max, b.max),
                   a.lo, a.hi, a.hist + b.hist)


@runtime_checkable
class Reducer(Protocol):
    """What a user reducer declares. ``state`` must be small and picklable.

    ``update`` folds one shard's pipeline output into a state; ``merge`` combines two states
    (it must be associative and commutative: :func:`check_merger` checks it); ``finalize``
    turns the root state into what :attr:`Result.value` returns.
    """

    def init(self) -> Any: ...

    def update(self, state: Any, y: np.ndarray) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...

    def finalize(self, state: Any) -> Any: ...


@dataclass(frozen=True)
class MomentsReducer:
    """The built-in reducer: scalar outputs into :class:`Moments`."""

    range: tuple[float, float]
    bins: int

    def init(self) -> Moments:
        return Moments.empty(self.range, self.bins)

    def update(self, state: Moments, y: np.ndarray) -> Moments:
        return merge_moments(state, Moments.from_samples(y, self.range, self.bins))

    def merge(self, a: Moments, b: Moments) -> Moments:
        return merge_moments(a, b)

    def finalize(self, state: Moments) -> Moments:
        return state
