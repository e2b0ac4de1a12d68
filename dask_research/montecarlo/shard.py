"""What runs on a worker: draw a shard's inputs, evaluate the pipeline, accumulate.

A task computes an aligned block of shards and folds them with the fixed tree, so the split
into tasks never changes the bits. Any shard can be recomputed alone with
:func:`compute_shard`.

Examples
--------
>>> from dask_research.montecarlo import Job, Normal
>>> job = Job(lambda a: a * 2, {"a": Normal(0.0, 1.0)}, shards=4, samples_per_shard=256,
...           seed=1, range=(-8, 8))
>>> compute_shard(job, 3) == compute_shard(job, 3)
True
"""
from __future__ import annotations

import os
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import PipelineError
from . import philox
from .accumulators import Reducer
from .tree import tree_fold

__all__ = ["draw_inputs", "evaluate", "compute_shard", "compute_block", "BlockResult"]


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
        raise PipelineError(shard, f"the pipeline raised {_describe(e)}{_hint(e)}") from e
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


def _describe(e: BaseException) -> str:
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


def compute_shard(job, shard: int, reducer: Reducer | None = None,
                  range: tuple[float, float] | None = None) -> Any:
    """Recompute shard ``shard`` alone; the same bits as inside any run on this machine."""
    if not 0 <= shard < job.shards:
        from ..exceptions import InputError

        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=repr(job))
    if reducer is None and range is None and not job.frozen:
        from .pilot import pilot

        range = pilot(job).range
    reducer = reducer or job.make_reducer(range)
    y = evaluate(job, philox.shard_generator(job.key, shard), job.samples_per_shard, shard)
    return reducer.update(reducer.init(), y)


@dataclass
class BlockResult:
    """A task's output: the block's folded state and each shard's own state (or its stored file)."""

    start: int
    stop: int
    state: Any
    shard_states: dict[int, Any] = field(repr=False)
    computed: list[int] = field(default_factory=list)
    worker: str = "local"
    seconds: float = 0.0
    #: Set when the task wrote its shard file itself (see :mod:`.blocks`): the file and the
    #: sha256 of its states. ``shard_states`` then holds only the few the client keeps.
    stored: str | None = None
    checksum: str | None = None
    #: Why the task did not write the store itself (the client then writes ``shard_states``).
    store_note: str | None = None


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return "local"


def _on_worker(err: PipelineError, worker: str) -> PipelineError:
    """``err`` with the worker that raised it in its message and as ``err.worker``."""
    out = PipelineError(err.shard, f"{err.problem} (on worker {worker})", count=err.count)
    out.worker = worker   # type: ignore[attr-defined]
    return out


def compute_block(job, reducer: Reducer, start: int, stop: int,
                  known: Mapping[int, Any] | None = None, tamper: Any = None) -> BlockResult:
    """Compute shards ``start..stop-1`` (reusing ``known`` states) and fold them with the tree.

    ``tamper`` is a test hook: a callable ``(worker, shard, y) -> y`` applied to pipeline
    outputs (used to simulate a faulty worker in verification tests).
    """
    t0 = time.perf_counter()
    known = dict(known or {})
    worker = _worker_address()
    states: dict[int, Any] = {}
    computed = []
    for shard in range(start, stop):
        if shard in known:
            states[shard] = known[shard]
            continue
        try:
            y = evaluate(job, philox.shard_generator(job.key, shard), job.samples_per_shard, shard)
            if tamper is not None:
                y = tamper(worker, shard, y)
            states[shard] = reducer.update(reducer.init(), y)
        except PipelineError as e:
            raise _on_worker(e, worker) from e.__cause__
        except Exception as e:       # the reducer's update, a MemoryError, ...
            raise _on_worker(PipelineError(shard, f"accumulating it raised {_describe(e)}"), worker) from e
        computed.append(shard)
    folded = tree_fold(reducer.merge, [states[s] for s in range(start, stop)])
    return BlockResult(start, stop, folded, states, computed, worker, time.perf_counter() - t0)
