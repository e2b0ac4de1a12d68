"""A block of device shards: draw on the device, run the pipeline once, one state per shard.

A GPU is only fast when it has a lot to do per launch, so a task draws *all* of its shards in
one kernel launch (``(rows, words)``), calls the pipeline once on the flattened
``rows * samples`` arrays, and reduces every row to its own :class:`Moments` on the device;
only the small states travel back. With ``xp=numpy`` the very same code runs on a CPU: that is
how verification re-runs a GPU shard, and how CI tests this path.

The pipeline must be sample-wise (each output depends only on the same sample's inputs), which
is what the job's "one value per sample" contract already asks: then calling it on one shard
or on many at once gives the same values. A pipeline that accepts an ``xp`` keyword receives
the namespace (``numpy`` or ``cupy``); NumPy ufuncs (``np.exp``, ``np.tanh``...) also work on
CuPy arrays directly.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a: 2 * a, {"a": mc.Normal(0, 1)}, shards=4, samples_per_shard=8,
...              seed=1, device="any")
>>> evaluate_rows(job, first=0, rows=2).shape        # two shards' outputs, drawn at once
(2, 8)
>>> [m.n for m in row_moments(evaluate_rows(job, 0, 2), (-5.0, 5.0), bins=10)]
[8, 8]
>>> block_function(job).__name__
'compute_block_portable'
>>> type(recompute_shard(job, 1)).__name__           # the CPU re-run verification does
'Moments'
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...exceptions import InputError, PipelineError
from ..accumulators import Moments, MomentsReducer, Reducer
from ..shard_compute import BlockResult, _worker_address
from ..tree import tree_fold
from . import draws
from .device_choice import select_xp

__all__ = ["row_moments", "evaluate_rows", "compute_rows", "compute_block_portable",
           "compute_shard_portable", "block_function", "recompute_shard"]

#: Most raw words one launch holds (2**27 words = 1 GiB); bigger blocks are drawn in chunks.
MAX_WORDS = 1 << 27


def _to_host(x: Any) -> np.ndarray:
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


def row_moments(y, hist_range: tuple[float, float], bins: int, xp: Any = np) -> list[Moments]:
    """One :class:`Moments` per row of ``y`` (``(rows, n)``), the arithmetic of ``from_samples``."""
    rows, n = y.shape
    lo, hi = float(hist_range[0]), float(hist_range[1])
    if n == 0:
        return [Moments.empty((lo, hi), bins) for _ in range(rows)]
    mean = xp.sum(y, axis=1) / n
    d = y - mean[:, None]
    d2 = d * d
    m2 = xp.sum(d2, axis=1)
    m3 = xp.sum(d * d2, axis=1)
    m4 = xp.sum(d2 * d2, axis=1)
    t = (y - lo) * (bins / (hi - lo))
    t = xp.clip(xp.floor(t), -1.0, float(bins)) + 1.0
    idx = t.astype(xp.int64) + (xp.arange(rows, dtype=xp.int64) * (bins + 2))[:, None]
    hist = xp.bincount(idx.ravel(), minlength=rows * (bins + 2)).reshape(rows, bins + 2)
    scal = xp.stack([mean, m2, m3, m4, xp.min(y, axis=1), xp.max(y, axis=1)])
    scal, hist = _to_host(scal), _to_host(hist).astype(np.int64)
    return [Moments(n, float(scal[0, r]), float(scal[1, r]), float(scal[2, r]), float(scal[3, r]),
                    float(scal[4, r]), float(scal[5, r]), lo, hi, hist[r].copy())
            for r in range(rows)]


def _accepts_xp(pipeline) -> bool:
    try:
        params = inspect.signature(pipeline).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "xp" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)


def evaluate_rows(job, first: int, rows: int, xp: Any = np):
    """Pipeline outputs of shards ``first .. first + rows - 1``, ``(rows, n)`` on ``xp``."""
    n = job.samples_per_shard
    cols = draws.draw_rows(job.inputs, job.key, first, rows, n, xp)
    flat = {k: v.reshape(-1) for k, v in cols.items()}
    if _accepts_xp(job.pipeline):
        flat["xp"] = xp
    y = xp.asarray(job.pipeline(**flat))
    if y.ndim != 1 or y.shape[0] != rows * n:
        raise PipelineError(first if rows == 1 else f"{first}..{first + rows - 1}",
                            f"returned shape {tuple(y.shape)} for {rows * n} samples; a device job "
                            f"needs a sample-wise pipeline with one scalar per sample")
    if y.dtype.kind not in "fiub":
        raise PipelineError(first, f"returned dtype {y.dtype}; expected real numbers")
    y = y.astype(xp.float64, copy=False).reshape(rows, n)
    finite = xp.isfinite(y)
    if not bool(finite.all()):
        bad = _to_host(~finite)
        r = int(np.flatnonzero(bad.any(axis=1))[0])
        count = int(bad[r].sum())
        kind = "nan" if bool(_to_host(xp.isnan(y[r])).any()) else "inf"
        raise PipelineError(first + r, f"{count:,} of {n:,} values are not finite ({kind}); the "
                            f"first is sample {int(np.flatnonzero(bad[r])[0])}", count=count)
    return y


def compute_rows(job, reducer: Reducer, first: int, rows: int, xp: Any = np,
                 tamper: Any = None, worker: str = "local") -> list[Any]:
    """Reducer states of shards ``first .. first + rows - 1`` (drawn in chunks of MAX_WORDS)."""
    per = max(1, draws.words_per_shard(job.inputs, job.samples_per_shard))
    chunk = max(1, MAX_WORDS // per)
    out: list[Any] = []
    for a in range(first, first + rows, chunk):
        k = min(chunk, first + rows - a)
        y = evaluate_rows(job, a, k, xp)
        if tamper is None and isinstance(reducer, MomentsReducer):
            out.extend(row_moments(y, reducer.range, reducer.bins, xp))
            continue
        yh = _to_host(y)
        for r in range(k):
            row = yh[r] if tamper is None else tamper(worker, a + r, yh[r])
            out.append(reducer.update(reducer.init(), row))
    return out


def compute_block_portable(job, reducer: Reducer, start: int, stop: int,
                           known: Mapping[int, Any] | None = None, tamper: Any = None,
                           xp: Any = None) -> BlockResult:
    """Same contract as :func:`~dask_research.montecarlo.shard_compute.compute_block`, for device jobs.

    ``xp=None`` picks the namespace for this worker with :func:`.device_choice.select_xp`. Runs of
    consecutive unknown shards are computed together (one launch per run).
    """
    t0 = time.perf_counter()
    xp = select_xp(job) if xp is None else xp
    known = dict(known or {})
    worker = _worker_address()
    states: dict[int, Any] = {s: known[s] for s in range(start, stop) if s in known}
    computed: list[int] = []
    s = start
    while s < stop:
        if s in known:
            s += 1
            continue
        e = s
        while e < stop and e not in known:
            e += 1
        for i, st in enumerate(compute_rows(job, reducer, s, e - s, xp, tamper, worker)):
            states[s + i] = st
        computed.extend(range(s, e))
        s = e
    folded = tree_fold(reducer.merge, [states[i] for i in range(start, stop)])
    return BlockResult(start, stop, folded, states, computed, worker, time.perf_counter() - t0)


def compute_shard_portable(job, shard: int, reducer: Reducer | None = None,
                           range: tuple[float, float] | None = None, xp: Any = np) -> Any:
    """Recompute one shard of a device job alone (default on the CPU, as verification does)."""
    if not 0 <= shard < job.shards:
        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=repr(job))
    if reducer is None and range is None and not job.frozen:
        from ..pilot import pilot

        range = pilot(job).range
    reducer = reducer or job.make_reducer(range)
    return compute_rows(job, reducer, shard, 1, xp)[0]


# --- what the engine calls (one dispatch on the job's device) ----------------------------------
def block_function(job):
    """The task function for a block of ``job``'s shards: ``compute_block`` or the portable one.

    Both take ``(job, reducer, start, stop, known=None, tamper=None)`` and return a
    :class:`~dask_research.montecarlo.shard_compute.BlockResult`.
    """
    from .device_choice import is_portable

    if is_portable(job):
        return compute_block_portable
    from ..shard_compute import compute_block

    return compute_block


def recompute_shard(job, shard: int, reducer: Reducer | None = None,
                    range: tuple[float, float] | None = None) -> Any:
    """Re-run one shard on this process's CPU, as verification, the referee and replay do.

    The ordinary path for ``device="cpu"`` jobs (bit-identical), the portable algorithm with
    ``xp=numpy`` for device jobs (to be compared within :func:`.tolerance.tolerance_of`).
    """
    from .device_choice import is_portable

    if is_portable(job):
        return compute_shard_portable(job, shard, reducer, range, xp=np)
    from ..shard_compute import compute_shard

    return compute_shard(job, shard, reducer=reducer, range=range)
