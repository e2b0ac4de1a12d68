"""The CUDA Philox4x64-10 kernels: one thread per 4-word block, mirroring :mod:`.philox_ref`.

The source is generated from the reference's constants (:data:`SOURCE`), so the multipliers,
the Weyl increments, the round count, ``2**-53`` and ``2 pi`` have one definition. One device
function computes a block: the counter of block ``j`` of row ``r`` with the same carry steps
as :func:`.philox_ref.block_counters`, then the same rounds as :func:`.philox_ref.philox4x64`,
with ``__umul64hi`` for the high half of the 128-bit product. Two kernels use it:

``philox4x64_10_rows``
    the raw words (what CI compares with ``numpy.random.Philox`` bit for bit);
``philox4x64_10_draw``
    one input of the portable algorithm (:mod:`.draws`) without writing the words out: a
    thread turns its block into four uniforms, or two Box-Muller pairs, then applies the
    distribution's affine map (and ``exp`` for LogNormal), in the order the NumPy path does.

Kernels are compiled with ``--fmad=false`` so that no multiply-add is contracted: the only
differences from the NumPy path are those of CUDA's ``log``/``cos``/``sin``/``exp``.

Importing this module needs no CuPy; the functions below import it when called. The same
source also compiles as plain C++ with a small shim (``tests/montecarlo/test_gpu_kernel.py``),
which is how CI runs *this* text, not a transcription, on a CPU.

Examples
--------
>>> "philox4x64_10_rows" in SOURCE and "philox4x64_10_draw" in SOURCE
True
>>> cp = cupy_or_none()                  # None on a machine without CuPy and a CUDA device
>>> cp is None or hasattr(cp, "cuda")
True
"""
from __future__ import annotations

import math
from typing import Any

from ...exceptions import ResearchError
from . import philox_ref as ref

__all__ = ["KERNEL_NAME", "DRAW_KERNEL_NAME", "DRAW_KINDS", "SOURCE", "THREADS", "OPTIONS",
           "raw_rows_cupy", "draw_rows_cupy", "cupy_or_none"]

KERNEL_NAME = "philox4x64_10_rows"
DRAW_KERNEL_NAME = "philox4x64_10_draw"
#: Distribution codes of the draw kernel: out = f(z or u) with parameters (p0, p1).
DRAW_KINDS = {"normal": 0, "lognormal": 1, "uniform": 2}
#: Threads per CUDA block.
THREADS = 256
#: NVRTC options: no fused multiply-add, so float steps are the NumPy path's steps.
OPTIONS = ("--fmad=false",)

_TEMPLATE = r"""
typedef unsigned long long u64;

/* the counter of block j of row r, counter + (r << 64) + 1 + j with carries (block_counters),
   then Philox4x64-@ROUNDS@ of it (philox_ref.philox4x64); words v[0]..v[3] into x */
__device__ __forceinline__ void philox_block(
    const u64 key0_in, const u64 key1_in, const u64 c0, const u64 c1, const u64 c2,
    const u64 c3, const u64 r, const u64 j, u64* x)
{
    const u64 w1 = c1 + r;
    u64 k2 = (w1 < r) ? 1ull : 0ull;
    const u64 inc = j + 1ull;
    const u64 w0 = c0 + inc;
    const u64 k1 = (w0 < inc) ? 1ull : 0ull;
    const u64 w1b = w1 + k1;
    k2 += (w1b == 0ull && k1 == 1ull) ? 1ull : 0ull;
    const u64 w2 = c2 + k2;
    const u64 k3 = (w2 < k2) ? 1ull : 0ull;
    const u64 w3 = c3 + k3;
    u64 x0 = w0, x1 = w1b, x2 = w2, x3 = w3;
    u64 key0 = key0_in, key1 = key1_in;
    #pragma unroll
    for (int rd = 0; rd < @ROUNDS@; ++rd) {
        if (rd) { key0 += @W0@ull; key1 += @W1@ull; }
        const u64 hi0 = __umul64hi(@M0@ull, x0);
        const u64 lo0 = @M0@ull * x0;
        const u64 hi1 = __umul64hi(@M1@ull, x2);
        const u64 lo1 = @M1@ull * x2;
        const u64 y0 = hi1 ^ x1 ^ key0;
        const u64 y2 = hi0 ^ x3 ^ key1;
        x0 = y0; x1 = lo1; x2 = y2; x3 = lo0;
    }
    x[0] = x0; x[1] = x1; x[2] = x2; x[3] = x3;
}

/* raw words: out[r, 4 (j - first) + k] = word k of block j of row r, cut at n */
extern "C" __global__ void @NAME@(
    const u64 key0, const u64 key1, const u64 c0, const u64 c1, const u64 c2, const u64 c3,
    const long long rows, const long long blocks, const long long n, const long long first,
    u64* __restrict__ out)
{
    const long long t = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (t >= rows * blocks) return;
    const u64 r = (u64)(t / blocks);
    const u64 jj = (u64)(t % blocks);
    u64 x[4];
    philox_block(key0, key1, c0, c1, c2, c3, r, (u64)first + jj, x);
    u64* o = out + r * (u64)n + 4ull * jj;
    const long long left = n - 4 * (long long)jj;
    o[0] = x[0];
    if (left > 1) o[1] = x[1];
    if (left > 2) o[2] = x[2];
    if (left > 3) o[3] = x[3];
}

/* one input of the portable algorithm (draws.py), from blocks first .. first + blocks - 1 */
extern "C" __global__ void @DRAW@(
    const u64 key0, const u64 key1, const u64 c0, const u64 c1, const u64 c2, const u64 c3,
    const long long rows, const long long blocks, const long long n, const long long first,
    const int kind, const double p0, const double p1, double* __restrict__ out)
{
    const long long t = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (t >= rows * blocks) return;
    const u64 r = (u64)(t / blocks);
    const u64 jj = (u64)(t % blocks);
    u64 x[4];
    philox_block(key0, key1, c0, c1, c2, c3, r, (u64)first + jj, x);
    double v[4];
    double u[4];
    for (int k = 0; k < 4; ++k) u[k] = (double)(x[k] >> 11) * @INV53@;   /* uniforms() */
    if (kind == 2) {                                                      /* Uniform */
        for (int k = 0; k < 4; ++k) v[k] = u[k] * p1 + p0;
    } else {                                                              /* box_muller() */
        for (int q = 0; q < 2; ++q) {
            const double a = 1.0 - u[2 * q];
            const double rr = sqrt(-2.0 * log(a));
            const double th = @TWO_PI@ * u[2 * q + 1];
            v[2 * q] = rr * cos(th);
            v[2 * q + 1] = rr * sin(th);
        }
        for (int k = 0; k < 4; ++k) {
            v[k] = v[k] * p1 + p0;                                        /* x * sd + mu */
            if (kind == 1) v[k] = exp(v[k]);                              /* LogNormal */
        }
    }
    double* o = out + r * (u64)n + 4ull * jj;
    const long long left = n - 4 * (long long)jj;
    for (int k = 0; k < 4; ++k) if (k < left) o[k] = v[k];
}
"""


def _source() -> str:
    subs = {"NAME": KERNEL_NAME, "DRAW": DRAW_KERNEL_NAME, "ROUNDS": str(ref.ROUNDS),
            "M0": f"0x{ref.M0:016X}", "M1": f"0x{ref.M1:016X}", "W0": f"0x{ref.W0:016X}",
            "W1": f"0x{ref.W1:016X}",
            # repr() of a float round-trips exactly: the very doubles draws.py uses
            "INV53": repr(2.0**-53), "TWO_PI": repr(2.0 * math.pi)}
    text = _TEMPLATE
    for k, v in subs.items():
        text = text.replace(f"@{k}@", v)
    return text


#: CUDA C source of the kernels, constants substituted from :mod:`.philox_ref`.
SOURCE = _source()

_MODULE: Any = None


def cupy_or_none() -> Any:
    """The ``cupy`` module if it imports and sees a CUDA device, else ``None``."""
    try:
        import cupy
    except Exception:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    return cupy


def _module():
    global _MODULE
    if _MODULE is None:
        cp = cupy_or_none()
        if cp is None:
            raise ResearchError("the GPU Philox kernel needs CuPy and a CUDA device "
                                "(pip install cupy-cuda12x); use xp=numpy on a CPU")
        _MODULE = cp.RawModule(code=SOURCE, options=OPTIONS)
    return _MODULE


def _launch(name: str, key, counter: int, rows: int, n: int, first_block: int, extra: tuple,
            dtype: str):
    mod = _module()                   # raises ResearchError (with the reason) without CuPy
    import cupy as cp

    c = ref.counter_words(counter)
    blocks = -(-n // 4)
    out = cp.empty((rows, n), dtype=dtype)
    total = rows * blocks
    if total == 0:
        return out
    u = cp.uint64
    args = (u(int(key[0])), u(int(key[1])), u(c[0]), u(c[1]), u(c[2]), u(c[3]),
            cp.int64(rows), cp.int64(blocks), cp.int64(n), cp.int64(first_block), *extra, out)
    mod.get_function(name)(((total + THREADS - 1) // THREADS,), (THREADS,), args)
    return out


def raw_rows_cupy(key, counter: int, rows: int, n: int, first_block: int = 0):
    """CuPy ``(rows, n)`` uint64 array equal to :func:`.philox_ref.raw_rows` of the same args."""
    return _launch(KERNEL_NAME, key, counter, rows, n, first_block, (), "uint64")


def draw_rows_cupy(key, counter: int, rows: int, n: int, first_block: int, kind: str,
                   p0: float, p1: float):
    """CuPy ``(rows, n)`` float64 draws of one input (see :func:`.draws.draw_rows`)."""
    import numpy as np

    return _launch(DRAW_KERNEL_NAME, key, counter, rows, n, first_block,
                   (np.int32(DRAW_KINDS[kind]), np.float64(p0), np.float64(p1)), "float64")
