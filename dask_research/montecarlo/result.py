"""The result of a Monte-Carlo run: estimates, intervals, quantiles, and the delta method.

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.accumulators import Moments
>>> from dask_research.montecarlo.result import Result
>>> y = np.random.default_rng(0).normal(10.0, 2.0, 100_000)
>>> r = Result("0" * 64, Moments.from_samples(y, (0.0, 20.0), 200))
>>> round(r.mean, 1), round(r.sd, 1)
(10.0, 2.0)
>>> lo, hi = r.interval(0.95).percentile
>>> round(lo), round(hi)
(6, 14)
>>> r                                   # one line; print(r) is the full summary
Result(job, run_id=000000000000, mean=9.99... ± 0.012 (95 % CI), n=100,000, shards=0)
"""
from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from ..exceptions import InputError
from .accumulators import Moments
from .linearize import Linearized

if TYPE_CHECKING:
    from .run_settings import RunSettings

__all__ = ["Result", "Interval", "mean_pm", "mean_text", "verification_sentence", "reused_sentence"]


def _decimals(halfwidth: float) -> int | None:
    """Decimals that show two significant digits of ``halfwidth`` (``None``: fall back to ``.6g``)."""
    if not (math.isfinite(halfwidth) and halfwidth > 0):
        return None
    return int(min(15, max(0, 1 - math.floor(math.log10(halfwidth)))))


def _num(x: float, decimals: int | None) -> str:
    return f"{x:.6g}" if decimals is None or not math.isfinite(x) else f"{x:.{decimals}f}"


def mean_pm(mean: float, stderr: float, level: float = 0.95) -> str:
    """The mean and the half-width of its ``level`` confidence interval, as :func:`mean_text`
    begins: the half-width to two significant digits, the mean to as many decimals.

    >>> mean_pm(-0.0257696, 0.0398)
    '-0.026 ± 0.078'
    """
    half = _z(level) * stderr
    d = _decimals(half)
    return f"{_num(mean, d)} ± {_num(half, d)}"


def mean_text(mean: float, stderr: float, level: float = 0.95) -> str:
    """The mean with its confidence interval, labelled, as every place that prints one says it.

    The half-width shows two significant digits and the mean and interval as many decimals;
    the standard error two significant digits, trailing zeros kept (``0.040``, not ``0.04``).
    ``Result``'s summary, ``mc show`` and the HTML report print this one line.

    >>> mean_text(-0.0257696, 0.0398)
    '-0.026 ± 0.078 (95 % CI of the mean [-0.104, 0.052]; stderr 0.040)'
    >>> mean_text(1.5, 0.0)
    '1.5 ± 0 (95 % CI of the mean [1.5, 1.5]; stderr 0)'
    """
    half = _z(level) * stderr
    d = _decimals(half)
    return (f"{mean_pm(mean, stderr, level)} ({level * 100:g} % CI of the mean "
            f"[{_num(mean - half, d)}, {_num(mean + half, d)}]; stderr {_stderr_text(stderr)})")


def _stderr_text(stderr: float) -> str:
    """Two significant digits, trailing zeros kept: ``0.040``, ``1.2e-05``."""
    return f"{stderr:#.2g}".rstrip(".") if math.isfinite(stderr) and stderr > 0 else f"{stderr:g}"


def _z(level: float) -> float:
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise InputError("level", level, "a probability strictly between 0 and 1", where="Result")
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass(frozen=True)
class Interval:
    """A central interval of the output distribution at ``level``.

    ``normal`` is ``mean +- z * sd`` (what a normal approximation claims), ``percentile`` the
    sampled quantiles (read from the histogram); their disagreement shows skew and tails.
    """

    level: float
    normal: tuple[float, float]
    percentile: tuple[float, float]


@dataclass
class Result:
    """Estimates of a finished (and verified) run.

    Attributes
    ----------
    run_id : str
        The job's content address.
    state : Moments or user state
        The root accumulator; ``value`` is the reducer's ``finalize`` of it.
    linearized : Linearized or None
        Delta-method sd and plug-in value ``g(mu)``, to compare with ``sd`` and ``mean``.
    """

    run_id: str
    state: Any
    value: Any = None
    linearized: Linearized | None = None
    pilot: dict | None = None
    wall_seconds: float = float("nan")
    shards: int = 0
    samples_per_shard: int = 0
    shards_per_task: int = 0
    workers: dict[str, int] = field(default_factory=dict)
    verification: dict | None = None
    computed_shards: int = 0
    name: str = ""
    reused_shards: int = 0
    speculated: list = field(default_factory=list)
    max_in_flight: int = 0
    #: The run's settings (:class:`~.run_settings.RunSettings`), as it used them; ``None``: not a run's.
    settings: RunSettings | None = None

    def __post_init__(self):
        if self.value is None:
            self.value = self.state

    # -- moments ----------------------------------------------------------------------------
    def _m(self) -> Moments:
        if not isinstance(self.state, Moments):
            raise TypeError("this run used a user reducer: read result.value instead")
        return self.state

    @property
    def n(self) -> int:
        return self._m().n

    @property
    def mean(self) -> float:
        return self._m().mean

    @property
    def var(self) -> float:
        m = self._m()
        return m.m2 / (m.n - 1) if m.n > 1 else math.nan

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)

    @property
    def stderr(self) -> float:
        """Standard error of the mean: ``sd / sqrt(n)``."""
        return self.sd / math.sqrt(self.n)

    @property
    def skewness(self) -> float:
        m = self._m()
        return math.sqrt(m.n) * m.m3 / m.m2**1.5 if m.m2 > 0 else math.nan

    @property
    def kurtosis(self) -> float:
        """Excess kurtosis (0 for a normal)."""
        m = self._m()
        return m.n * m.m4 / (m.m2 * m.m2) - 3.0 if m.m2 > 0 else math.nan

    @property
    def min(self) -> float:
        return self._m().min

    @property
    def max(self) -> float:
        return self._m().max

    @property
    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(edges, counts)`` of the in-range bins; see ``underflow`` and ``overflow``."""
        m = self._m()
        return m.edges, m.hist[1:-1].copy()

    @property
    def underflow(self) -> int:
        return int(self._m().hist[0])

    @property
    def overflow(self) -> int:
        return int(self._m().hist[-1])

    @property
    def samples_per_second(self) -> float:
        return self.computed_shards * self.samples_per_shard / self.wall_seconds if self.wall_seconds > 0 else math.nan

    # -- intervals and quantiles ------------------------------------------------------------
    def quantile(self, q):
        """Quantiles read from the histogram by linear interpolation within a bin.

        Accurate to about one bin width; values in the underflow/overflow counters are
        interpolated between the exact ``min``/``max`` and the histogram range.
        """
        m = self._m()
        qs = np.atleast_1d(np.asarray(q, dtype=float))
        if ((qs < 0) | (qs > 1) | ~np.isfinite(qs)).any():
            raise InputError("q", q, "probabilities in [0, 1]", where="Result.quantile")
        # Cumulative counts at knots: min, lo, e_1 .. e_{bins-1}, hi, max.
        knots_x = np.concatenate([[min(m.min, m.lo)], m.edges, [max(m.max, m.hi)]])
        knots_c = np.concatenate([[0], np.cumsum(m.hist)]).astype(float)
        out = np.interp(qs * m.n, knots_c, knots_x)
        out = np.clip(out, m.min, m.max)
        return float(out[0]) if np.ndim(q) == 0 else out

    def interval(self, level: float = 0.95) -> Interval:
        """Normal (``mean +- z sd``) and percentile intervals holding ``level`` of the output."""
        z = _z(level)
        a = (1 - level) / 2
        lo, hi = self.quantile([a, 1 - a])
        return Interval(level, (self.mean - z * self.sd, self.mean + z * self.sd), (float(lo), float(hi)))

    def mean_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Confidence interval of the mean: ``mean +- z stderr``."""
        z = _z(level)
        return (self.mean - z * self.stderr, self.mean + z * self.stderr)

    # -- presentation -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Scalars of the run, JSON-able.

        Two different 95 % intervals are reported, under names that say which is which:
        ``mean_interval95`` is the confidence interval of the mean (``mean +- 1.96 stderr``;
        quote this for the estimate), ``output_interval95_percentile`` and
        ``output_interval95_normal`` hold 95 % of the outputs themselves (sampled percentiles,
        and ``mean +- 1.96 sd``): about ``sqrt(n)`` times wider.
        """
        out: dict[str, Any] = {"run_id": self.run_id, "name": self.name, "shards": self.shards,
                               "samples_per_shard": self.samples_per_shard,
                               "wall_seconds": self.wall_seconds, "shards_per_task": self.shards_per_task,
                               "workers": self.workers, "verification": self.verification,
                               "computed_shards": self.computed_shards, "reused_shards": self.reused_shards,
                               "speculated": self.speculated, "max_in_flight": self.max_in_flight}
        if isinstance(self.state, Moments):
            iv = self.interval(0.95)
            out.update(n=self.n, mean=self.mean, sd=self.sd, stderr=self.stderr,
                       mean_interval95=list(self.mean_interval(0.95)), skewness=self.skewness,
                       kurtosis=self.kurtosis, min=self.min, max=self.max,
                       output_interval95_percentile=list(iv.percentile),
                       output_interval95_normal=list(iv.normal),
                       underflow=self.underflow, overflow=self.overflow,
                       samples_per_second=self.samples_per_second)
        if self.linearized is not None:
            out["linearized"] = self.linearized.to_dict()
        if self.settings is not None:
            out["settings"] = self.settings.record()
        return out

    def to_json(self) -> str:
        return json.dumps(self.summary(), indent=2, default=float)

    def __repr__(self) -> str:
        """One line, as for :class:`Job` (``print(result)`` is the full summary).

        The ``±`` is the half-width of the 95 % confidence interval of the mean, as everywhere.
        """
        head = f"Result({self.name or 'job'}, run_id={self.run_id[:12]}"
        if not isinstance(self.state, Moments):
            value = repr(self.value)
            return f"{head}, value={value if len(value) <= 60 else value[:57] + '...'})"
        z = _z(0.95)
        return (f"{head}, mean={self.mean:.6g} ± {z * self.stderr:.2g} (95 % CI), n={self.n:,}, "
                f"shards={self.shards})")

    def __str__(self) -> str:
        if not isinstance(self.state, Moments):
            return f"Result {self.run_id[:12]}: {self.value!r}"
        lines = [
            f"Monte-Carlo result {self.name} [{self.run_id[:12]}]",
            f"  samples              {self.n:,} ({self.shards} shards x {self.samples_per_shard:,})",
            *self._interval_lines(),
        ]
        if self.linearized is not None:
            lin = self.linearized
            lines.append(f"  linearized           g(mu) {lin.value:.6g}   delta-method sd {lin.sd:.6g}"
                         f"   (sampled mean {self.mean:.6g}, sd {self.sd:.6g})")
        if self.wall_seconds == self.wall_seconds:
            lines.append(self._wall_line())
        if self.verification:
            lines.append(self._verified_line())
        reused = reused_sentence(self.to_summary_record())
        if reused:
            lines.append(f"  reused shards        {reused}")
        return "\n".join(lines)

    def _wall_line(self) -> str:
        head = f"  wall                 {self.wall_seconds:.2f} s"
        if self.computed_shards == 0 and self.reused_shards:
            return f"{head}: all {self.reused_shards} shards reused from the store (resumed), none computed"
        text = (f"{head}, {self.samples_per_second / 1e6:.2f} M samples/s, {self.shards_per_task} shard{'s' if self.shards_per_task != 1 else ''} per task "
                f"on {len(self.workers)} worker{'s' if len(self.workers) != 1 else ''}")
        if self.reused_shards:
            text += f"; {self.reused_shards} shards reused from the store"
        return text

    def _verified_line(self) -> str:
        """Where the verification re-runs happened, as recorded per check (never assumed)."""
        return f"  verified             {verification_sentence(self.to_summary_record())}"

    def to_summary_record(self) -> dict[str, Any]:
        """The fields :func:`verification_sentence` reads (as ``result.json`` holds them)."""
        return {"verification": self.verification or {}, "workers": self.workers,
                "computed_shards": self.computed_shards, "reused_shards": self.reused_shards}

    def _interval_lines(self, level: float = 0.95) -> list[str]:
        """The mean with its confidence interval, the sd, then the output's intervals, labelled."""
        pct = f"{level * 100:g} %"
        z = _z(level)
        iv = self.interval(level)
        a = (1 - level) / 2 * 100
        return [
            f"  mean                 {mean_text(self.mean, self.stderr, level)}",
            f"  sd                   {self.sd:.6g}   skewness {self.skewness:.3g}   "
            f"excess kurtosis {self.kurtosis:.3g}",
            f"  output {pct} sampled  [{iv.percentile[0]:.6g}, {iv.percentile[1]:.6g}] "
            f"({a:g}th-{100 - a:g}th percentiles of the outputs)",
            f"  output {pct} normal   [{iv.normal[0]:.6g}, {iv.normal[1]:.6g}] "
            f"(mean ± {z:.3g} sd: the outputs' spread, not the mean's uncertainty)",
        ]

    def _repr_html_(self) -> str:
        if not isinstance(self.state, Moments):
            return f"<pre>{html.escape(str(self))}</pre>"
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in self._html_rows())
        return (f"<div><b>Monte-Carlo result</b> <code>{self.run_id[:12]}</code>"
                f"<table>{rows}</table>{self._svg_histogram()}</div>")

    def _html_rows(self):
        iv = self.interval(0.95)
        lo, hi = self.mean_interval(0.95)
        z = _z(0.95)
        d = _decimals(z * self.stderr)
        yield "samples", f"{self.n:,}"
        yield "mean", f"{mean_pm(self.mean, self.stderr)} (stderr {_stderr_text(self.stderr)})"
        yield "95 % CI of the mean", f"[{_num(lo, d)}, {_num(hi, d)}]"
        yield "sd", f"{self.sd:.6g}"
        yield "output 95 % sampled", f"[{iv.percentile[0]:.6g}, {iv.percentile[1]:.6g}] (percentiles of the outputs)"
        yield "output 95 % normal", f"[{iv.normal[0]:.6g}, {iv.normal[1]:.6g}] (mean ± {z:.3g} sd)"
        if self.linearized is not None:
            yield "linearized", f"g(μ) {self.linearized.value:.6g}, sd {self.linearized.sd:.6g}"

    def _svg_histogram(self, width: int = 320, height: int = 80) -> str:
        edges, counts = self.histogram
        if counts.max() <= 0:
            return ""
        bw = width / counts.size
        bars = "".join(
            f"<rect x='{i * bw:.2f}' y='{height - h:.2f}' width='{bw:.2f}' height='{h:.2f}'/>"
            for i, h in enumerate(counts / counts.max() * height) if h > 0)
        return f"<svg width='{width}' height='{height}' style='fill:#4c72b0'>{bars}</svg>"


def verification_sentence(record: Mapping[str, Any]) -> str:
    """What a run's verification did, from its record (a :class:`Result` or ``result.json``).

    Each check is counted by where it really ran: on another worker than the shard's producer,
    on the producer itself (one worker), or, for shards an earlier run stored, on this cluster.

    >>> verification_sentence({"verification": {"checked": [{"producer": "w", "same_worker": True}] * 4},
    ...                        "workers": ["w"], "computed_shards": 64, "reused_shards": 0})
    '4 shards re-run, all match: 4 on the same worker that computed them, the only worker that ran this job'
    """
    v = record.get("verification") or {}
    checked = v.get("checked") or []
    workers = list(record.get("workers") or [])

    def stored(c: Mapping[str, Any]) -> bool:
        return _stored_check(c, record)

    n_stored = sum(1 for c in checked if stored(c))
    same = sum(1 for c in checked if c.get("same_worker") and not stored(c))
    other = len(checked) - n_stored - same
    parts = []
    if other:
        parts.append(f"{other} on another worker than the one that computed them")
    if same:
        alone = ", the only worker that ran this job" if len(workers) <= 1 else ""
        parts.append(f"{same} on the same worker that computed them{alone}")
    if n_stored:
        parts.append(f"{n_stored} stored by an earlier run, recomputed on this cluster")
    mismatches = v.get("mismatches") or []
    verdict = "all match" if not mismatches else f"{len(mismatches)} mismatched"
    quarantined = v.get("quarantined_workers") or []
    tail = f"; quarantined {', '.join(quarantined)}" if quarantined else ""
    return f"{len(checked)} shards re-run, {verdict}: {'; '.join(parts) or 'none'}{tail}"


def _stored_check(c: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Whether check ``c`` re-ran a shard an earlier run stored (its producer did no work here)."""
    workers = list(record.get("workers") or [])
    reused, computed = int(record.get("reused_shards") or 0), int(record.get("computed_shards") or 0)
    p = c.get("producer")
    return p in (None, "?") or bool(reused and workers and p not in workers) or (computed == 0 and reused > 0)


def reused_sentence(record: Mapping[str, Any]) -> str | None:
    """How many of the shards a run reused from its store were re-run (``None``: it reused none).

    A reused shard was computed by an earlier run and read back from the store, where anyone
    who can write the store could have edited it. The store refuses every state that breaks an
    accumulator's invariants; an edit that keeps them all is caught only by re-running the
    shard, so with ``k`` of ``N`` reused shards re-run, one edited shard is caught with
    probability ``k/N``. ``research.montecarlo.verify-reused: all`` re-runs every one.

    >>> reused_sentence({"verification": {"reused_checked": [3, 9]}, "reused_shards": 16})
    '2 of 16 reused shards re-run at random: a stored shard edited within every invariant is caught only if it is one of the 2 (probability 2/16); research.montecarlo.verify-reused: all re-runs every one'
    >>> reused_sentence({"verification": {"reused_checked": [3, 9], "checked": [{"shard": 5, "producer": "old"}]},
    ...                  "reused_shards": 16, "workers": ["w"], "computed_shards": 0})  # doctest: +ELLIPSIS
    "2 of 16 reused shards re-run at random (1 more re-run where the run's own checks fell, ...): ... one of the 2 (probability 2/16); ..."
    >>> reused_sentence({"verification": {"reused_checked": list(range(4))}, "reused_shards": 4})
    '4 of 4 reused shards re-run: every shard this result reuses from the store was recomputed'
    """
    reused = int(record.get("reused_shards") or 0)
    if reused <= 0:
        return None
    v = record.get("verification")
    if v and "reused_checked" not in v:
        return (f"{reused} shards reused from the store; how many were re-run is not recorded (an older version "
                "wrote this result): research.montecarlo.verify-reused: all re-runs every one")
    drawn = set((v or {}).get("reused_checked") or [])
    k = len(drawn)
    # The run's own hashed checks landed on reused shards too: re-run as well, but public (a
    # function of the run id), so they count for damage, not for an edit made to avoid them.
    public = {c.get("shard") for c in ((v or {}).get("checked") or []) if _stored_check(c, record)} - drawn
    if k + len(public) >= reused and k < reused:
        return f"{k + len(public)} of {reused} reused shards re-run: every shard this result reuses from the store was recomputed"
    if k >= reused:
        return f"{k} of {reused} reused shards re-run: every shard this result reuses from the store was recomputed"
    why = " (verify=0)" if not v else ""
    more = (f" ({len(public)} more re-run where the run's own checks fell, chosen from the run id: public, so an "
            "edit can avoid them)") if public else ""
    return (f"{k} of {reused} reused shards re-run{' at random' if k else ''}{why}{more}: a stored shard edited within every "
            f"invariant is caught only if it is one of the {k} (probability {k}/{reused}); "
            "research.montecarlo.verify-reused: all re-runs every one")
