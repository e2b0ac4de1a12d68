"""Input distributions of a Monte-Carlo job.

Each distribution draws from a ``numpy.random.Generator`` (a shard's Philox stream), knows its
mean and covariance (for the delta method) and describes itself as JSON for the content
address. Parameters are checked when the job is built, so the error can name the input:
``input 'b' (LogNormal): sigma=-0.1 is invalid; expected a positive finite number``.

A correlated block is one :class:`MultivariateNormal` under a tuple key::

    inputs = {"a": Normal(1.0, 0.1), ("b", "c"): MultivariateNormal([2, 0.5], [[.09, .01], [.01, .0025]])}

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.distributions import Normal, Triangular
>>> gen = np.random.default_rng(0)
>>> Normal(1.0, 0.1).draw(gen, 4).shape
(4,)
>>> float(Triangular(0.0, 1.0, 3.0).mean()[0])
1.3333333333333333
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import InputError

__all__ = [
    "Distribution", "Normal", "LogNormal", "Uniform", "Triangular", "TruncatedNormal",
    "Beta", "Fixed", "MultivariateNormal", "from_spec",
]

_POS = "a positive finite number"
_FIN = "a finite number"


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


class Distribution:
    """Base class: ``dim`` values per sample, drawn from a shard's generator."""

    dim: int = 1

    def draw(self, gen: np.random.Generator, n: int) -> np.ndarray:
        """``n`` samples: shape ``(n,)`` when ``dim == 1`` else ``(dim, n)``."""
        raise NotImplementedError

    def mean(self) -> np.ndarray:
        """Mean vector, shape ``(dim,)``."""
        raise NotImplementedError

    def cov(self) -> np.ndarray:
        """Covariance matrix, shape ``(dim, dim)``."""
        raise NotImplementedError

    def problems(self) -> list[tuple[str, Any, str]]:
        """``(parameter, value, expected)`` for every invalid parameter."""
        return []

    def validate(self, where: str | None = None) -> None:
        """Raise :class:`InputError` for the first invalid parameter."""
        probs = self.problems()
        if probs:
            name, value, expected = probs[0]
            label = f"{where} ({type(self).__name__})" if where else repr(self)
            raise InputError(name, value, expected, where=label)

    def spec(self) -> dict:
        """JSON description used in the content address (kind + parameters)."""
        out: dict[str, Any] = {"kind": type(self).__name__}
        for k, v in self.__dict__.items():
            if k.startswith("_"):
                continue
            out[k] = np.asarray(v, dtype=float).tolist() if isinstance(v, (list, tuple, np.ndarray)) else float(v)
        return out


@dataclass(frozen=True, repr=True)
class Normal(Distribution):
    """Normal with mean ``mu`` and standard deviation ``sd`` (> 0)."""

    mu: float
    sd: float

    def problems(self):
        p = []
        if not _finite(self.mu):
            p.append(("mu", self.mu, _FIN))
        if not (_finite(self.sd) and self.sd > 0):
            p.append(("sd", self.sd, _POS))
        return p

    def draw(self, gen, n):
        x = gen.standard_normal(n)
        x *= self.sd
        x += self.mu
        return x

    def mean(self):
        return np.array([float(self.mu)])

    def cov(self):
        return np.array([[float(self.sd) ** 2]])


@dataclass(frozen=True)
class LogNormal(Distribution):
    """``exp(N(mu, sigma))``: ``mu`` and ``sigma`` are the mean and sd of the logarithm."""

    mu: float
    sigma: float

    def problems(self):
        p = []
        if not _finite(self.mu):
            p.append(("mu", self.mu, _FIN))
        if not (_finite(self.sigma) and self.sigma > 0):
            p.append(("sigma", self.sigma, _POS))
        return p

    def draw(self, gen, n):
        x = gen.standard_normal(n)
        x *= self.sigma
        x += self.mu
        return np.exp(x, out=x)

    def mean(self):
        return np.array([math.exp(self.mu + self.sigma**2 / 2)])

    def cov(self):
        s2 = self.sigma**2
        return np.array([[math.expm1(s2) * math.exp(2 * self.mu + s2)]])


@dataclass(frozen=True)
class Uniform(Distribution):
    """Uniform on ``[lo, hi)`` with ``lo < hi``."""

    lo: float
    hi: float

    def problems(self):
        if not _finite(self.lo):
            return [("lo", self.lo, _FIN)]
        if not (_finite(self.hi) and self.hi > self.lo):
            return [("hi", self.hi, f"a finite number greater than lo={self.lo!r}")]
        return []

    def draw(self, gen, n):
        u = gen.random(n)
        u *= self.hi - self.lo
        u += self.lo
        return u

    def mean(self):
        return np.array([(self.lo + self.hi) / 2])

    def cov(self):
        return np.array([[(self.hi - self.lo) ** 2 / 12]])


@dataclass(frozen=True)
class Triangular(Distribution):
    """Triangular on ``[lo, hi]`` with peak at ``mode``; inverse CDF of one uniform per draw."""

    lo: float
    mode: float
    hi: float

    def problems(self):
        if not all(_finite(v) for v in (self.lo, self.mode, self.hi)):
            bad = next(k for k in ("lo", "mode", "hi") if not _finite(getattr(self, k)))
            return [(bad, getattr(self, bad), _FIN)]
        if not self.lo < self.hi:
            return [("hi", self.hi, f"a number greater than lo={self.lo!r}")]
        if not self.lo <= self.mode <= self.hi:
            return [("mode", self.mode, f"a number in [lo, hi] = [{self.lo!r}, {self.hi!r}]")]
        return []

    def draw(self, gen, n):
        a, c, b = float(self.lo), float(self.mode), float(self.hi)
        u = gen.random(n)
        fc = (c - a) / (b - a)
        left = u < fc
        out = np.empty(n)
        out[left] = a + np.sqrt(u[left] * (b - a) * (c - a))
        out[~left] = b - np.sqrt((1 - u[~left]) * (b - a) * (b - c))
        return out

    def mean(self):
        return np.array([(self.lo + self.mode + self.hi) / 3])

    def cov(self):
        a, c, b = self.lo, self.mode, self.hi
        return np.array([[(a * a + b * b + c * c - a * b - a * c - b * c) / 18]])


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def _Phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


@dataclass(frozen=True)
class TruncatedNormal(Distribution):
    """Normal(``mu``, ``sd``) restricted to ``[lo, hi]`` (either may be infinite).

    Drawn by rejection from the shard's normal stream in fixed rounds, so the draw is exact and
    deterministic. The kept mass ``P(lo <= X <= hi)`` must be at least 1e-3.
    """

    mu: float
    sd: float
    lo: float = -math.inf
    hi: float = math.inf

    def _mass(self) -> float:
        return _Phi((self.hi - self.mu) / self.sd) - _Phi((self.lo - self.mu) / self.sd)

    def problems(self):
        p = Normal(self.mu, self.sd).problems()
        if p:
            return p
        if math.isnan(self.lo) or math.isnan(self.hi) or not self.lo < self.hi:
            return [("hi", self.hi, f"a number greater than lo={self.lo!r}")]
        if self._mass() < 1e-3:
            return [("lo", self.lo, f"bounds that keep at least 0.1% of the normal's mass "
                     f"(they keep {self._mass():.3g})")]
        return []

    def draw(self, gen, n):
        out = np.empty(n)
        filled = 0
        mass = self._mass()
        while filled < n:
            need = n - filled
            x = gen.standard_normal(int(need / mass * 1.1) + 16)
            x *= self.sd
            x += self.mu
            x = x[(x >= self.lo) & (x <= self.hi)][:need]
            out[filled:filled + x.size] = x
            filled += x.size
        return out

    def _ab(self):
        return (self.lo - self.mu) / self.sd, (self.hi - self.mu) / self.sd

    def mean(self):
        a, b = self._ab()
        return np.array([self.mu + self.sd * (_phi(a) - _phi(b)) / self._mass()])

    def cov(self):
        a, b = self._ab()
        z = self._mass()
        ta = a * _phi(a) if math.isfinite(a) else 0.0
        tb = b * _phi(b) if math.isfinite(b) else 0.0
        r = (_phi(a) - _phi(b)) / z
        return np.array([[self.sd**2 * (1 + (ta - tb) / z - r * r)]])


@dataclass(frozen=True)
class Beta(Distribution):
    """Beta(``a``, ``b``) scaled to ``[lo, hi]`` (default ``[0, 1]``)."""

    a: float
    b: float
    lo: float = 0.0
    hi: float = 1.0

    def problems(self):
        for k in ("a", "b"):
            v = getattr(self, k)
            if not (_finite(v) and v > 0):
                return [(k, v, _POS)]
        return Uniform(self.lo, self.hi).problems()

    def draw(self, gen, n):
        x = gen.beta(self.a, self.b, n)
        if self.lo != 0.0 or self.hi != 1.0:
            x *= self.hi - self.lo
            x += self.lo
        return x

    def mean(self):
        return np.array([self.lo + (self.hi - self.lo) * self.a / (self.a + self.b)])

    def cov(self):
        s = self.a + self.b
        return np.array([[(self.hi - self.lo) ** 2 * self.a * self.b / (s * s * (s + 1))]])


@dataclass(frozen=True)
class Fixed(Distribution):
    """A known constant: draws nothing from the stream."""

    value: float

    def problems(self):
        return [] if _finite(self.value) else [("value", self.value, _FIN)]

    def draw(self, gen, n):
        return np.full(n, float(self.value))

    def mean(self):
        return np.array([float(self.value)])

    def cov(self):
        return np.zeros((1, 1))


@dataclass(frozen=True, eq=False)
class MultivariateNormal(Distribution):
    """A correlated normal block: use it under a tuple of input names.

    ``x = mean + L z`` with ``L`` the Cholesky factor of ``cov``; the product is evaluated
    with element-wise numpy operations in a fixed order (no BLAS), so a shard's draws are the
    same bits wherever it runs.
    """

    mean_: Any = field(metadata={"doc": "mean vector"})
    cov_: Any = field(metadata={"doc": "covariance matrix"})

    def __init__(self, mean, cov):
        object.__setattr__(self, "mean_", np.array(mean, dtype=float))
        object.__setattr__(self, "cov_", np.array(cov, dtype=float))

    def __repr__(self):
        return f"MultivariateNormal(mean={self.mean_.tolist()}, cov={self.cov_.tolist()})"

    def __eq__(self, other):
        return (isinstance(other, MultivariateNormal) and np.array_equal(self.mean_, other.mean_)
                and np.array_equal(self.cov_, other.cov_))

    __hash__ = None  # type: ignore[assignment]

    @property
    def dim(self) -> int:  # type: ignore[override]
        return int(self.mean_.size)

    def problems(self):
        m, c = self.mean_, self.cov_
        if m.ndim != 1 or m.size < 1 or not np.isfinite(m).all():
            return [("mean", m.tolist(), "a 1-d vector of finite numbers")]
        if c.shape != (m.size, m.size) or not np.isfinite(c).all():
            return [("cov", c.tolist(), f"a finite {m.size}x{m.size} matrix")]
        if not np.array_equal(c, c.T):
            return [("cov", c.tolist(), "a symmetric matrix")]
        try:
            np.linalg.cholesky(c)
        except np.linalg.LinAlgError:
            return [("cov", c.tolist(), "a positive-definite matrix")]
        return []

    def draw(self, gen, n):
        k = self.dim
        z = gen.standard_normal((k, n))
        L = np.linalg.cholesky(self.cov_)
        out = np.empty((k, n))
        for i in range(k):
            row = np.full(n, self.mean_[i])
            for j in range(i + 1):
                row += L[i, j] * z[j]
            out[i] = row
        return out

    def mean(self):
        return self.mean_.copy()

    def cov(self):
        return self.cov_.copy()

    def spec(self):
        return {"kind": "MultivariateNormal", "mean": self.mean_.tolist(), "cov": self.cov_.tolist()}


_KINDS = {c.__name__: c for c in (Normal, LogNormal, Uniform, Triangular, TruncatedNormal, Beta, Fixed)}


def from_spec(spec: dict) -> Distribution:
    """Rebuild a distribution from :meth:`Distribution.spec` (no code is executed).

    >>> from_spec(Normal(1.0, 0.5).spec())
    Normal(mu=1.0, sd=0.5)
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise InputError("spec", spec, "a dict with a 'kind' naming a distribution")
    kind = spec["kind"]
    params = {k: v for k, v in spec.items() if k not in ("kind", "names")}
    if kind == "MultivariateNormal":
        return MultivariateNormal(params.get("mean"), params.get("cov"))
    if kind not in _KINDS:
        raise InputError("kind", kind, f"one of {sorted([*_KINDS, 'MultivariateNormal'])}")
    try:
        return _KINDS[kind](**{k: float(v) for k, v in params.items()})
    except (TypeError, ValueError) as e:
        raise InputError("spec", spec, f"the parameters of {kind} ({e})") from None
