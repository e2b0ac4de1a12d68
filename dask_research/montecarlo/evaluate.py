"""Evaluating a pipeline on one stream: draw the inputs, call the pipeline, check its output.

What the pilot and every shard run (:mod:`.pilot`, :mod:`.shard_compute`). An exception the pipeline
raises, or an output of the wrong shape or with non-finite values, becomes a
:class:`~dask_research.exceptions.PipelineError` that names the shard.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal, philox
>>> job = Job(lambda a: a * 2, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=256, seed=1)
>>> y = evaluate(job, philox.shard_generator(job.key, 3), 256, 3)
>>> y.shape, bool((y == evaluate(job, philox.shard_generator(job.key, 3), 256, 3)).all())
((256,), True)
>>> evaluate(job.replace(pipeline=lambda a: a[:3]), philox.shard_generator(job.key, 0), 256, 0)
Traceback (most recent call last):
...
dask_research.exceptions.PipelineError: pipeline output of shard 0: returned shape (3,); expected (256,), one value per sample (a vector-valued pipeline needs a reducer=)
"""
from __future__ import annotations

import os
import traceback
from typing import Any

import numpy as np

from ..exceptions import PipelineError

__all__ = ["draw_inputs", "evaluate", "check_output", "describe_error"]


def draw_inputs(job, gen: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Draw ``n`` samples of every input, in declared order, from one stream."""
    out: dict[str, np.ndarray] = {}
    for key, dist in job.inputs.items():
        x = dist.draw(gen, n)
        if isinstance(key, tuple):
            for i, name in enumerate(key):
                out[name] = x[i]
        else:
            out[key] = x
    return out


def check_output(y: Any, n: int, shard: int | str, scalar: bool = True) -> np.ndarray:
    """Validate a pipeline's output: one finite value per sample."""
    arr = np.asarray(y)
    if arr.ndim == 0 or arr.shape[0] != n or (scalar and arr.ndim != 1):
        expected = f"({n},)" if scalar else f"({n}, ...)"
        raise PipelineError(shard, f"returned shape {arr.shape}; expected {expected}, one value per "
                            f"sample (a vector-valued pipeline needs a reducer=)")
    if arr.dtype.kind not in "fiub":
        raise PipelineError(shard, f"returned dtype {arr.dtype}; expected real numbers")
    arr = arr.astype(np.float64, copy=False)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = ~finite
        count = int(bad.sum())
        first = int(np.flatnonzero(bad.reshape(n, -1).any(axis=1))[0])
        kinds = "nan" if np.isnan(arr).any() else "inf"
        raise PipelineError(shard, f"{count:,} of {arr.size:,} values are not finite ({kinds}); the "
                            f"first is sample {first}", count=count)
    return arr


def evaluate(job, gen: np.random.Generator, n: int, shard: int | str) -> np.ndarray:
    """Draw inputs from ``gen`` and run the pipeline; the checked output.

    An exception raised by the pipeline becomes a :class:`PipelineError` naming the shard and
    the original error (type and message; the original is its ``__cause__``).
    """
    draws = draw_inputs(job, gen, n)
    try:
        y = job.pipeline(**draws)
    except Exception as e:
        raise PipelineError(shard, f"the pipeline raised {describe_error(e)}{_hint(e)}") from e
    return check_output(y, n, shard, scalar=job.reducer is None)


#: What numpy says when a scalar-only function (``math.exp``, ``float(x)``) meets an array.
_SCALAR_ONLY = ("only 0-dimensional arrays can be converted", "only length-1 arrays can be converted",
                "only size-1 arrays can be converted", "truth value of an array with more than one element")


def _hint(e: BaseException) -> str:
    """A pointer for the usual first mistake: a pipeline written for one sample, not arrays."""
    if isinstance(e, (TypeError, ValueError)) and any(m in str(e) for m in _SCALAR_ONLY):
        return ("; the pipeline is called with one array per input (all samples of a shard at once): "
                "use numpy's vectorised functions (np.exp, np.where) instead of math.* or if/else on values")
    return ""


def describe_error(e: BaseException) -> str:
    """``Type: message (at file.py:line)`` of an exception, on one line.

    The line is where it was raised: Dask ships the traceback of the error a task raises, not
    of its cause, so the pipeline's own frame is named here.
    """
    msg = " ".join(str(e).split())
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        f = frames[-1]
        where = f"line {f.lineno}" if f.filename.startswith("<") else f"{os.path.basename(f.filename)}:{f.lineno}"
        text += f" (in {f.name}, {where})"
    return text
