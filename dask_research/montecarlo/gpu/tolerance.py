"""The tolerance class of device (portable) shards, and the comparison verification uses.

A GPU shard and its CPU re-run compute the same algorithm from the same integer uniforms; they
differ only where floating-point functions (``log``, ``cos``, ``sin``, ``exp``, ``tanh``...)
round differently (CUDA's libdevice is within 1-2 ulp, glibc within 1) and where sums are
added in another order (CuPy's tree reduction vs numpy's pairwise sum: relative error below
``log2(n) * eps`` of the sum of magnitudes). For a pipeline of condition number ``kappa`` that
is about ``kappa * 4 ulp`` per sample, ``~1e-15 * kappa`` in the moments. The class is
``rtol = 1e-12``: room for ``kappa`` up to about 1e3, and seven orders of magnitude below what
one wrong sample in a 65,536-sample shard does to its mean (``~1e-5``) or a mis-drawn input
does to anything.

Each field is compared on its natural scale, so cancellation does not make a tiny rounding
difference look large: ``mean`` against ``|mean| + sd``, ``min``/``max`` against
``|value| + |mean| + sd``, ``m2`` and ``m4`` against themselves, ``m3`` against
``sqrt(m2 * m4)`` (its Cauchy-Schwarz bound). ``n`` and the histogram edges must be equal;
histogram counts may differ only by samples that moved across an edge, at most
:data:`HIST_SLACK` in every prefix sum (a sample within ``rtol`` of one of 256 edges is a
``~1e-10`` event per shard).

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.accumulators import Moments
>>> y = np.random.default_rng(0).normal(size=4096)
>>> a = Moments.from_samples(y, (-5.0, 5.0), 32)
>>> b = Moments.from_samples(y * (1 + 2e-16), (-5.0, 5.0), 32)
>>> compare(a, b) is None
True
>>> compare(a, Moments.from_samples(y + 1e-6, (-5.0, 5.0), 32)) is not None
True
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..accumulators import Moments
from ..mergers import compare_states

__all__ = ["GPU_TOLERANCE", "GPU_RTOL", "HIST_SLACK", "compare", "differences", "states_match",
           "tolerance_of"]

#: Relative tolerance of the device class.
GPU_RTOL = 1e-12
#: The tolerance class, as recorded in a device job's content address and verification events.
GPU_TOLERANCE = f"rtol={GPU_RTOL:g}"
#: Largest difference allowed in any prefix sum of two shard histograms.
HIST_SLACK = 2


def _close(x: float, y: float, scale: float, rtol: float) -> bool:
    if x == y:
        return True
    if not (math.isfinite(x) and math.isfinite(y)):
        return False
    return abs(x - y) <= rtol * scale


def _scales(a: Moments, b: Moments) -> list[tuple[str, float, float, float]]:
    sd = math.sqrt(max(a.m2, b.m2, 0.0) / a.n)
    mscale = max(abs(a.mean), abs(b.mean)) + sd
    return [
        ("mean", a.mean, b.mean, mscale),
        ("min", a.min, b.min, max(abs(a.min), abs(b.min)) + mscale),
        ("max", a.max, b.max, max(abs(a.max), abs(b.max)) + mscale),
        ("m2", a.m2, b.m2, max(abs(a.m2), abs(b.m2))),
        ("m4", a.m4, b.m4, max(abs(a.m4), abs(b.m4))),
        ("m3", a.m3, b.m3, math.sqrt(max(a.m2, b.m2, 0.0) * max(a.m4, b.m4, 0.0))),
    ]


def differences(a: Moments, b: Moments) -> dict[str, float]:
    """Each field's difference on its scale (what :func:`compare` holds to ``rtol``), and the
    worst histogram prefix-sum drift (``"hist"``, in samples). For reporting figures."""
    out = {name: (0.0 if x == y else abs(x - y) / scale if scale else math.inf)
           for name, x, y, scale in (_scales(a, b) if a.n and a.n == b.n else [])}
    if a.hist.size == b.hist.size:
        out["hist"] = float(np.abs(np.cumsum(a.hist.astype(np.int64) - b.hist)).max())
    return out


def _compare_moments(a: Moments, b: Moments, rtol: float, path: str) -> str | None:
    if a.n != b.n:
        return f"{path}.n: {a.n} vs {b.n} (compared exactly)"
    if (a.lo, a.hi, a.hist.size) != (b.lo, b.hi, b.hist.size):
        return f"{path}: histogram edges [{a.lo}, {a.hi}) x {a.bins} vs [{b.lo}, {b.hi}) x {b.bins}"
    if a.n == 0:
        return None
    for name, x, y, scale in _scales(a, b):
        if not _close(float(x), float(y), scale, rtol):
            rel = abs(x - y) / scale if scale else math.inf
            return (f"{path}.{name}: {x!r} vs {y!r} differ by {rel:.3g} of their scale "
                    f"{scale:.6g}; the class allows rtol={rtol:g}")
    drift = np.abs(np.cumsum(a.hist.astype(np.int64) - b.hist.astype(np.int64)))
    worst = int(drift.max()) if drift.size else 0
    if worst > HIST_SLACK or int(a.hist.sum()) != int(b.hist.sum()):
        i = int(np.argmax(drift))
        return (f"{path}.hist: {worst} samples on different sides of edge {i} (counts "
                f"{a.hist.tolist()[max(0, i - 1):i + 2]} vs {b.hist.tolist()[max(0, i - 1):i + 2]}); "
                f"the class allows {HIST_SLACK}")
    return None


def compare(state_gpu: Any, state_cpu: Any, rtol: float = GPU_RTOL, path: str = "state") -> str | None:
    """``None`` if a device shard's state agrees with its CPU re-run in the class, else why not.

    :class:`Moments` are compared field by field on their natural scales (module docstring);
    any other reducer state falls back to :func:`~dask_research.montecarlo.mergers.compare_states`
    with ``rtol`` (integers exactly).
    """
    if isinstance(state_gpu, Moments) and isinstance(state_cpu, Moments):
        return _compare_moments(state_gpu, state_cpu, float(rtol), path)
    return compare_states(state_gpu, state_cpu, rtol=float(rtol), path=path)


def tolerance_of(job) -> str:
    """The tolerance class verification must use for ``job``: ``exact`` or :data:`GPU_TOLERANCE`."""
    from .device_choice import is_portable

    return GPU_TOLERANCE if is_portable(job) else "exact"


def states_match(a: Any, b: Any, tolerance: str | float) -> str | None:
    """Drop-in for :func:`~dask_research.montecarlo.verify.states_match` that knows the device class.

    ``tolerance`` is ``"exact"``, ``"rtol=<x>"`` (as :func:`tolerance_of` returns) or a number.
    """
    if tolerance == "exact":
        return compare_states(a, b, rtol=0.0, exact=True)
    if isinstance(tolerance, str) and tolerance.startswith("rtol="):
        tolerance = tolerance[len("rtol="):]
    return compare(a, b, rtol=float(tolerance))
