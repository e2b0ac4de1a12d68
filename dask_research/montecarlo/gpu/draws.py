"""Portable draws: inputs computed from the raw Philox stream the same way on NumPy and CuPy.

numpy's ``standard_normal`` is a ziggurat whose consumption of the stream depends on the
values drawn, which a GPU cannot reproduce in parallel. Jobs that may run on a GPU therefore
use this *portable* algorithm (:data:`ALGORITHM`) on every device, CPU re-runs included:

* a uniform is ``(word >> 11) * 2**-53`` (numpy's own 53-bit double, exact on both sides);
* normals come in Box-Muller pairs of consecutive words ``(u0, u1)``: ``a = 1 - u0`` (in
  ``(0, 1]``), ``r = sqrt(-2 log a)``, ``theta = 2 pi u1``, ``z = (r cos theta, r sin theta)``;
* every input consumes a fixed number of words per shard (``dim * m``, ``m`` = samples
  rounded up to a multiple of 4, one Philox block per 4 samples; :class:`Fixed` none), in
  declared order, so a shard's layout is known before any value is drawn, and every input
  starts on a block boundary (on a GPU one thread turns one block into four samples).

The integer steps are exact, so both sides start from the same uniforms; ``log``, ``sqrt``,
``cos``, ``sin`` and ``exp`` then differ by at most a few ulps between CUDA's libdevice and the
host's libm. That is what the tolerance class of :mod:`.tolerance` absorbs.

Supported: :class:`Normal`, :class:`LogNormal`, :class:`Uniform`, :class:`Triangular`,
:class:`Fixed`, :class:`MultivariateNormal`. ``TruncatedNormal`` (rejection, data-dependent)
and ``Beta`` (numpy's rejection samplers) have no portable form and are refused when the job
is built.

Arrays are ``(rows, m)``: one row per shard of a block, so a GPU draws many shards at once.

Examples
--------
>>> import numpy as np
>>> from dask_research import montecarlo as mc
>>> job = mc.Job(lambda a: 2 * a, {"a": mc.Normal(0, 1)}, shards=4, samples_per_shard=8,
...              seed=1, device="any")
>>> words_per_shard(job.inputs, 8)                    # 8 normals: 4 Box-Muller pairs of words
8
>>> cols = draw_rows(job.inputs, job.key, first_shard=0, rows=2, n=8)   # NumPy here
>>> cols["a"].shape
(2, 8)
>>> uniforms(np.array([0, 2**64 - 1], dtype=np.uint64))
array([0., 1.])
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...exceptions import InputError
from ..distributions import Distribution, Fixed, LogNormal, MultivariateNormal, Normal, Triangular, Uniform
from . import philox_ref

__all__ = ["ALGORITHM", "SUPPORTED", "check_portable", "words_per_shard", "raw_rows", "uniforms",
           "box_muller", "draw_rows", "namespace"]

#: Name of the portable draw algorithm, recorded in the content address of device jobs.
ALGORITHM = "philox4x64-10 raw; u53 = (w >> 11) * 2**-53; box-muller on word pairs; 4-aligned layout"
#: Distributions with a portable draw.
SUPPORTED = (Normal, LogNormal, Uniform, Triangular, Fixed, MultivariateNormal)

_TWO_PI = 2.0 * math.pi
_INV53 = 1.0 / 9007199254740992.0          # 2**-53, numpy's next_double scale


def namespace(*arrays: Any) -> Any:
    """The array namespace of the inputs: ``cupy`` if any is a CuPy array, else ``numpy``."""
    for a in arrays:
        mod = type(a).__module__.split(".")[0]
        if mod == "cupy":
            import cupy

            return cupy
    return np


def check_portable(inputs: dict, where: str = "Job") -> None:
    """Raise :class:`InputError` naming the first input without a portable draw."""
    for key, dist in inputs.items():
        if not isinstance(dist, SUPPORTED):
            raise InputError("distribution", dist, "one with a portable (GPU) draw: "
                             + ", ".join(c.__name__ for c in SUPPORTED)
                             + "; or device='cpu'", where=f"{where} input {key!r}")


def _aligned(n: int) -> int:
    return -(-n // 4) * 4


def _words(dist: Distribution, n: int) -> int:
    return 0 if isinstance(dist, Fixed) else dist.dim * _aligned(n)


def words_per_shard(inputs: dict, n: int) -> int:
    """Raw 64-bit words one shard of ``n`` samples consumes."""
    return sum(_words(d, n) for d in inputs.values())


def raw_rows(key, first_shard: int, rows: int, n: int, xp: Any = np, first_block: int = 0):
    """``(rows, n)`` raw words of shards ``first_shard..`` from block ``first_block`` on: the
    NumPy reference, or the CUDA kernel for ``xp=cupy``."""
    counter = int(first_shard) << 64
    if xp is np:
        return philox_ref.raw_rows(key, counter, rows, n, first_block)
    from .kernel import raw_rows_cupy

    return raw_rows_cupy(key, counter, rows, n, first_block)


def _fused(dist: Distribution) -> tuple[str, float, float] | None:
    """``(kind, p0, p1)`` of the GPU draw kernel for ``dist``, or ``None``: the same floats the
    NumPy path uses (``x * sd + mu``, ``exp(x * sigma + mu)``, ``u * (hi - lo) + lo``)."""
    if isinstance(dist, Normal):
        return "normal", float(dist.mu), float(dist.sd)
    if isinstance(dist, LogNormal):
        return "lognormal", float(dist.mu), float(dist.sigma)
    if isinstance(dist, Uniform):
        return "uniform", float(dist.lo), float(dist.hi) - float(dist.lo)
    return None


def uniforms(words, xp: Any = np):
    """53-bit doubles in ``[0, 1)`` from uint64 words (exact: ``k * 2**-53``, ``k < 2**53``)."""
    return (words >> xp.uint64(11)).astype(xp.float64) * _INV53


def box_muller(words, xp: Any = np):
    """Standard normals from ``(rows, m)`` words, ``m`` even: words ``2i, 2i+1`` give samples
    ``2i`` (cosine) and ``2i+1`` (sine)."""
    rows, m = words.shape
    u = uniforms(words, xp)
    a = 1.0 - u[:, 0::2]                      # exact, in (0, 1]: log is finite
    r = xp.sqrt(-2.0 * xp.log(a))
    theta = _TWO_PI * u[:, 1::2]
    return xp.stack([r * xp.cos(theta), r * xp.sin(theta)], axis=-1).reshape(rows, m)


def _draw_one(dist: Distribution, words, n: int, rows: int, xp: Any):
    """``(rows, n)`` (or ``(dim, rows, n)``) samples of one input from its words."""
    if isinstance(dist, Fixed):
        return xp.full((rows, n), float(dist.value))
    if isinstance(dist, Normal):
        x = box_muller(words, xp)[:, :n]
        return x * float(dist.sd) + float(dist.mu)
    if isinstance(dist, LogNormal):
        x = box_muller(words, xp)[:, :n]
        return xp.exp(x * float(dist.sigma) + float(dist.mu))
    if isinstance(dist, Uniform):
        u = uniforms(words[:, :n], xp)
        return u * (float(dist.hi) - float(dist.lo)) + float(dist.lo)
    if isinstance(dist, Triangular):
        a, c, b = float(dist.lo), float(dist.mode), float(dist.hi)
        u = uniforms(words[:, :n], xp)
        fc = (c - a) / (b - a)
        left = a + xp.sqrt(u * ((b - a) * (c - a)))
        right = b - xp.sqrt((1.0 - u) * ((b - a) * (b - c)))
        return xp.where(u < fc, left, right)
    if isinstance(dist, MultivariateNormal):
        k, m = dist.dim, _aligned(n)
        z = [box_muller(words[:, i * m:(i + 1) * m], xp)[:, :n] for i in range(k)]
        L = np.linalg.cholesky(dist.cov_)          # on the host, same bits on every worker
        out = []
        for i in range(k):
            row = xp.full((rows, n), float(dist.mean_[i]))
            for j in range(i + 1):
                row = row + float(L[i, j]) * z[j]
            out.append(row)
        return out
    raise InputError("distribution", dist, "one with a portable draw: "
                     + ", ".join(c.__name__ for c in SUPPORTED))


def draw_rows(inputs: dict, key, first_shard: int, rows: int, n: int,
              xp: Any = np) -> dict[str, Any]:
    """Every input of shards ``first_shard .. first_shard + rows - 1``: name -> ``(rows, n)``.

    On CuPy, Normal, LogNormal and Uniform inputs are drawn by the fused kernel (no words
    written to memory); everything else from the raw words of its own blocks.
    """
    out: dict[str, Any] = {}
    at = 0
    for name, dist in inputs.items():
        w = _words(dist, n)
        fused = None if xp is np else _fused(dist)
        if fused is not None:
            from .kernel import draw_rows_cupy

            x = draw_rows_cupy(key, int(first_shard) << 64, rows, n, at // 4, *fused)
        else:
            words = raw_rows(key, first_shard, rows, w, xp, first_block=at // 4) if w else None
            x = _draw_one(dist, words, n, rows, xp)
        at += w
        if isinstance(name, tuple):
            for i, sub in enumerate(name):
                out[sub] = x[i]
        else:
            out[name] = x
    return out
