"""The pilot: one shard on its own counter range, before any pool is used.

It validates the pipeline (shape, finiteness) before work is submitted, measures the spread
``sigma``, the memory and the time per shard, and freezes the histogram range (the pilot's [min, max]
widened by the job's ``range_margin``, the ``research.montecarlo.range-margin`` of when the job
was built, and rounded outward to three significant digits of the width, so the range, and
with it the content of every shard, is a deterministic function of the job). :meth:`Pilot.plan` turns a target standard error into a shard count and
an estimated wall time on the current pool.

The first pilot of a pipeline in a process evaluates its shard twice: once traced (its memory;
the process's first call of that code also warms it up) and once timed. A later pilot of the
same pipeline at the same size with the same inputs is warm: it evaluates the shard once,
timed, and takes the memory the first one traced (what a shard of that pipeline allocates does
not change within a process), which halves its time (a run's pilot is serial: the cluster
waits for it).

Examples
--------
>>> from dask_research.montecarlo import Job, Normal, pilot
>>> job = Job(lambda a: a + 1, {"a": Normal(0.0, 2.0)}, shards=4, samples_per_shard=4096, seed=3)
>>> p = pilot(job)
>>> 1.8 < p.sigma < 2.2
True
>>> plan = p.plan(target_stderr=0.01, threads=2)    # about (2 / 0.01)**2 / 4096 shards
>>> plan.shards * 4096 >= (p.sigma / 0.01) ** 2
True
"""
from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import philox
from .evaluate import evaluate

__all__ = ["pilot", "Pilot", "Plan", "freeze_range"]


def freeze_range(lo: float, hi: float, margin: float) -> tuple[float, float]:
    """Widen ``[lo, hi]`` by ``margin`` of its width per side, round out to 3 significant digits."""
    width = hi - lo
    if width <= 0 or not math.isfinite(width):
        scale = max(abs(lo), abs(hi), 1.0) * 1e-3
        lo, hi, width = lo - scale, hi + scale, 2 * scale
    lo -= margin * width
    hi += margin * width
    grid = 10.0 ** (math.floor(math.log10(hi - lo)) - 2)
    return (math.floor(lo / grid) * grid, math.ceil(hi / grid) * grid)


@dataclass
class Plan:
    """Shards needed for a target standard error and the expected wall time."""

    target_stderr: float
    sigma: float
    samples_per_shard: int
    shards: int
    threads: int
    shard_seconds: float
    est_seconds: float

    @property
    def total_samples(self) -> int:
        return self.shards * self.samples_per_shard

    def __str__(self) -> str:
        e = self.est_seconds                    # a sub-0.1 s plan keeps two digits, not "0.0 s"
        secs = f"{e:.1f}" if e >= 0.1 else f"{e:.2g}"
        return (f"target stderr {self.target_stderr:.3g} with sigma {self.sigma:.4g}: "
                f"{self.shards:,} shards x {self.samples_per_shard:,} = {self.total_samples:,} samples, "
                f"about {secs} s on {self.threads} thread{'s' if self.threads != 1 else ''} "
                f"({self.shard_seconds * 1e3:.1f} ms per shard)")


@dataclass
class Pilot:
    """What the pilot shard measured."""

    job: Any
    n: int
    mean: float
    sigma: float
    min: float
    max: float
    range: tuple[float, float] | None
    shard_seconds: float
    states: list = field(repr=False, default_factory=list)
    shard_bytes: int = 0

    def plan(self, target_stderr: float, client=None, threads: int | None = None,
             efficiency: float = 0.9) -> Plan:
        """Shards needed so that ``stderr <= target_stderr``, and the wall time to expect.

        ``threads`` defaults to the pool of ``client`` (or the current client), else the cores.
        """
        if not (isinstance(target_stderr, (int, float)) and target_stderr > 0):
            from ..exceptions import InputError

            raise InputError("target_stderr", target_stderr, "a positive number", where="Pilot.plan")
        if threads is None:
            threads = _pool_threads(client)
        samples = (self.sigma / target_stderr) ** 2
        shards = max(1, math.ceil(samples / self.job.samples_per_shard))
        est = shards * self.shard_seconds / (threads * efficiency)
        return Plan(float(target_stderr), self.sigma, self.job.samples_per_shard, shards, threads,
                    self.shard_seconds, est)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "sigma": self.sigma, "min": self.min, "max": self.max,
                "range": list(self.range) if self.range else None, "shard_seconds": self.shard_seconds,
                "shard_bytes": self.shard_bytes}


def _pool_threads(client=None) -> int:
    try:
        if client is None:
            from distributed import default_client

            client = default_client()
        return max(1, sum(client.nthreads().values()))
    except Exception:
        return os.cpu_count() or 1


#: Pipelines this process has piloted: pipeline -> {(samples, inputs): the traced peak bytes of
#: one evaluation}. A pilot found here is warm (see the module's docstring).
_PILOTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _piloted(job) -> dict | None:
    """What this process learnt from pilots of ``job``'s pipeline (``None``: a pipeline that
    cannot be remembered, one that is not hashable or takes no weak reference)."""
    try:
        return _PILOTED.setdefault(job.pipeline, {})
    except TypeError:
        return None


def pilot(job, samples: int | None = None, pieces: int = 8) -> Pilot:
    """Run the pilot shard locally and freeze the histogram range.

    Raises :class:`~dask_research.exceptions.PipelineError` if the pipeline's output has the
    wrong shape or non-finite values, before anything is submitted to a cluster.

    >>> from dask_research.montecarlo import Job, Normal
    >>> job = Job(lambda a: a * a, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=2048, seed=9)
    >>> first, warm = pilot(job), pilot(job)       # the second evaluates its shard once
    >>> (warm.range, warm.sigma, warm.shard_bytes) == (first.range, first.sigma, first.shard_bytes)
    True
    """
    import tracemalloc

    n = int(samples or job.samples_per_shard)
    gen = philox.pilot_generator(job.key)
    learnt = _piloted(job)
    known = (n, repr(job.inputs))
    peak = learnt.get(known) if learnt is not None and n == job.samples_per_shard else None
    warm = peak is not None
    seconds = 0.0          # of the evaluation below, where it is warm and timed
    if warm:
        t0 = time.perf_counter()
        y = evaluate(job, gen, n, "pilot")
        seconds = time.perf_counter() - t0
    else:
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            y = evaluate(job, gen, n, "pilot")
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if not tracing:
                tracemalloc.stop()
    shard_bytes = int(peak * job.samples_per_shard / n)
    flat = y if y.ndim == 1 else y.reshape(n, -1)[:, 0]
    lo, hi = float(flat.min()), float(flat.max())
    if job.reducer is not None:
        rng = None
    elif job.range is not None:
        rng = job.range
    else:
        rng = freeze_range(lo, hi, job.range_margin)
    reducer = job.make_reducer(rng)
    # Time one full shard (draw, pipeline, accumulate): the evaluation above where it was warm,
    # else one more after that warm-up.
    t0 = time.perf_counter()
    y2 = y if warm else evaluate(job, philox.pilot_generator(job.key), job.samples_per_shard, "pilot")
    reducer.update(reducer.init(), y2)
    shard_seconds = time.perf_counter() - t0 + seconds
    if learnt is not None:
        learnt[known] = peak
    # Real states for the merger check: the pilot split into uneven pieces.
    cuts = np.unique(np.linspace(0, n, pieces + 1).astype(int) + np.arange(pieces + 1) % 3)
    cuts = np.clip(cuts, 0, n)
    states = [reducer.update(reducer.init(), y[a:b]) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    return Pilot(job, n, float(flat.mean()), float(flat.std(ddof=1)) if n > 1 else 0.0, lo, hi,
                 rng, shard_seconds, states, shard_bytes)
