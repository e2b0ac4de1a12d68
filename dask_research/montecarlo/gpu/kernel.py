"""The CUDA Philox4x64-10 kernel: one thread per 4-word block, mirroring :mod:`.philox_ref`.

The source is generated from the reference's constants (:data:`SOURCE`), so the multipliers,
the Weyl increments and the round count have one definition. Each thread computes the block
counter of its ``(row, block)`` with the same carry steps as
:func:`.philox_ref.block_counters`, then the same rounds as :func:`.philox_ref.philox4x64`,
with ``__umul64hi`` for the high half of the 128-bit product. Importing this module needs no
CuPy; :func:`raw_rows_cupy` imports it when called.

The same source also compiles as plain C++ with a small shim (see ``tests/montecarlo/
test_gpu_kernel.py``), which is how CI runs *this* text, not a transcription, on a CPU.
"""
from __future__ import annotations

from typing import Any

from ...exceptions import ResearchError
from . import philox_ref as ref

__all__ = ["KERNEL_NAME", "SOURCE", "THREADS", "raw_rows_cupy", "cupy_or_none"]

KERNEL_NAME = "philox4x64_10_rows"
#: Threads per CUDA block.
THREADS = 256

_TEMPLATE = r"""
extern "C" __global__ void @NAME@(
    const unsigned long long key0_in, const unsigned long long key1_in,
    const unsigned long long c0, const unsigned long long c1,
    const unsigned long long c2, const unsigned long long c3,
    const long long rows, const long long blocks, const long long n,
    unsigned long long* __restrict__ out)
{
    const long long t = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (t >= rows * blocks) return;
    const unsigned long long r = (unsigned long long)(t / blocks);
    const unsigned long long j = (unsigned long long)(t % blocks);
    /* counter + (r << 64) + 1 + j, with carries: philox_ref.block_counters */
    const unsigned long long w1 = c1 + r;
    unsigned long long k2 = (w1 < r) ? 1ull : 0ull;
    const unsigned long long inc = j + 1ull;
    const unsigned long long w0 = c0 + inc;
    const unsigned long long k1 = (w0 < inc) ? 1ull : 0ull;
    const unsigned long long w1b = w1 + k1;
    k2 += (w1b == 0ull && k1 == 1ull) ? 1ull : 0ull;
    const unsigned long long w2 = c2 + k2;
    const unsigned long long k3 = (w2 < k2) ? 1ull : 0ull;
    const unsigned long long w3 = c3 + k3;
    /* rounds: philox_ref.philox4x64 */
    unsigned long long x0 = w0, x1 = w1b, x2 = w2, x3 = w3;
    unsigned long long key0 = key0_in, key1 = key1_in;
    #pragma unroll
    for (int rd = 0; rd < @ROUNDS@; ++rd) {
        if (rd) { key0 += @W0@ull; key1 += @W1@ull; }
        const unsigned long long hi0 = __umul64hi(@M0@ull, x0);
        const unsigned long long lo0 = @M0@ull * x0;
        const unsigned long long hi1 = __umul64hi(@M1@ull, x2);
        const unsigned long long lo1 = @M1@ull * x2;
        const unsigned long long y0 = hi1 ^ x1 ^ key0;
        const unsigned long long y2 = hi0 ^ x3 ^ key1;
        x0 = y0; x1 = lo1; x2 = y2; x3 = lo0;
    }
    /* words v[0]..v[3] of block j of row r, as numpy orders them; the last block is cut at n */
    unsigned long long* o = out + r * (unsigned long long)n + 4ull * j;
    const long long left = n - 4 * (long long)j;
    o[0] = x0;
    if (left > 1) o[1] = x1;
    if (left > 2) o[2] = x2;
    if (left > 3) o[3] = x3;
}
"""


def _source() -> str:
    subs = {"NAME": KERNEL_NAME, "ROUNDS": str(ref.ROUNDS), "M0": f"0x{ref.M0:016X}",
            "M1": f"0x{ref.M1:016X}", "W0": f"0x{ref.W0:016X}", "W1": f"0x{ref.W1:016X}"}
    text = _TEMPLATE
    for k, v in subs.items():
        text = text.replace(f"@{k}@", v)
    return text


#: CUDA C source of the kernel, constants substituted from :mod:`.philox_ref`.
SOURCE = _source()

_KERNEL: Any = None


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


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        cp = cupy_or_none()
        if cp is None:
            raise ResearchError("the GPU Philox kernel needs CuPy and a CUDA device "
                                "(pip install cupy-cuda12x); use xp=numpy on a CPU")
        _KERNEL = cp.RawKernel(SOURCE, KERNEL_NAME)
    return _KERNEL


def raw_rows_cupy(key, counter: int, rows: int, n: int):
    """CuPy ``(rows, n)`` uint64 array equal to :func:`.philox_ref.raw_rows` of the same args."""
    kern = _kernel()                      # raises ResearchError (with the reason) without CuPy
    import cupy as cp

    c = ref.counter_words(counter)
    blocks = -(-n // 4)
    out = cp.empty((rows, n), dtype=cp.uint64)
    total = rows * blocks
    if total == 0:
        return out
    grid = (total + THREADS - 1) // THREADS
    u = cp.uint64
    kern((grid,), (THREADS,), (u(int(key[0])), u(int(key[1])), u(c[0]), u(c[1]), u(c[2]), u(c[3]),
                               cp.int64(rows), cp.int64(blocks), cp.int64(n), out))
    return out
