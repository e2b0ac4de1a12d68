"""Philox4x64-10 in NumPy: the exact arithmetic, vectorised over many counters.

This is the reference the CUDA kernel (:mod:`.kernel`) mirrors line by line, and that CI checks
bit for bit against ``numpy.random.Philox`` and the Random123 known-answer vectors. It uses
only ``uint64`` arrays: the 64x64->128 product is formed from 32-bit halves, so every step is
exact integer arithmetic and the result cannot depend on the machine.

The constants below are the single source of truth: the kernel source is generated from them.

numpy's stream for ``Philox(key=K, counter=C)`` is, block after block, the four words of
``philox4x64_10(C + 1 + j, K)`` for ``j = 0, 1, ...`` (numpy increments the 256-bit counter
*before* each block, with carry across its four words), words in the order ``v[0]..v[3]``.
A NumPy counter is a block index, so there is no sub-block starting offset; a request for
``n`` words that is not a multiple of 4 is the first ``n`` words of the blocks.

Examples
--------
>>> import numpy as np
>>> from dask_research.montecarlo.gpu.philox_ref import raw_stream
>>> key = np.array([7, 11], dtype=np.uint64)
>>> ref = raw_stream(key, 5 << 64, 6)
>>> bool((ref == np.random.Philox(key=key, counter=5 << 64).random_raw(6)).all())
True
"""
from __future__ import annotations

import numpy as np

from ...exceptions import InputError

__all__ = ["M0", "M1", "W0", "W1", "ROUNDS", "mulhilo", "philox4x64", "counter_words",
           "block_counters", "raw_rows", "raw_stream"]

#: Philox4x64 round multipliers (Salmon et al. 2011, Random123 ``PHILOX_M4x64_0/1``).
M0 = 0xD2E7470EE14C6C93
M1 = 0xCA5A826395121157
#: Weyl key increments (golden ratio and sqrt(3) - 1, ``PHILOX_W64_0/1``).
W0 = 0x9E3779B97F4A7C15
W1 = 0xBB67AE8584CAA73B
#: Rounds of numpy's Philox (and of this package's ``ALGORITHM``, Philox4x64-10).
ROUNDS = 10

_U64 = np.uint64
_LO32 = _U64(0xFFFFFFFF)
_S32 = _U64(32)


def mulhilo(a: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo)`` 64-bit halves of the 128-bit product ``a * b`` (``a`` uint64 array)."""
    a = np.asarray(a, dtype=_U64)
    b64 = _U64(b)
    a0, a1 = a & _LO32, a >> _S32
    b0, b1 = b64 & _LO32, b64 >> _S32
    p00 = a0 * b0
    p01 = a0 * b1
    p10 = a1 * b0
    p11 = a1 * b1
    mid = (p00 >> _S32) + (p01 & _LO32) + (p10 & _LO32)       # < 3 * 2**32: no overflow
    hi = p11 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)
    lo = a * b64                                               # uint64 wraps modulo 2**64
    return hi, lo


def philox4x64(ctr: np.ndarray, key, rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x64-``rounds`` of counters ``ctr`` (shape ``(..., 4)`` uint64) under ``key``.

    Returns the ``(..., 4)`` output words ``v[0]..v[3]``.
    """
    ctr = np.asarray(ctr, dtype=_U64)
    if ctr.shape[-1:] != (4,):
        raise InputError("ctr", ctr.shape, "an array of shape (..., 4) of uint64 counter words")
    k0, k1 = _U64(int(key[0])), _U64(int(key[1]))
    c0, c1, c2, c3 = (ctr[..., i].copy() for i in range(4))
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r:                                  # bump the key between rounds
                k0 = _U64((int(k0) + W0) & 0xFFFFFFFFFFFFFFFF)
                k1 = _U64((int(k1) + W1) & 0xFFFFFFFFFFFFFFFF)
            hi0, lo0 = mulhilo(c0, M0)
            hi1, lo1 = mulhilo(c2, M1)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1)


def counter_words(counter: int) -> tuple[int, int, int, int]:
    """The four little-endian 64-bit words of a 256-bit counter."""
    if not isinstance(counter, (int, np.integer)) or not 0 <= int(counter) < 1 << 256:
        raise InputError("counter", counter, "an integer in [0, 2**256)")
    c = int(counter)
    return tuple((c >> (64 * i)) & 0xFFFFFFFFFFFFFFFF for i in range(4))  # type: ignore[return-value]


def block_counters(counter: int, rows: int, blocks: int, first_block: int = 0) -> np.ndarray:
    """Counters of ``blocks`` blocks for each of ``rows`` rows, shape ``(rows, blocks, 4)``.

    Row ``r`` is the stream of ``Philox(counter=counter + (r << 64))``: its block ``j`` uses
    counter ``counter + (r << 64) + 1 + j`` (numpy increments before each block), modulo
    2**256 with carry across the words. Shard ``s`` of a job is row ``s`` of counter 0. The
    blocks returned are ``j = first_block .. first_block + blocks - 1``.
    """
    if not (0 <= first_block and first_block + blocks < 2**64 - 1):
        raise InputError("first_block", first_block, "a block index with first_block + blocks < 2**64 - 1")
    c = counter_words(counter)
    r = np.arange(rows, dtype=_U64)[:, None]
    j = np.arange(first_block, first_block + blocks, dtype=_U64)[None, :]
    with np.errstate(over="ignore"):
        # word 1 gets the row (carry into words 2, 3); word 0 gets 1 + j (carry into 1, 2, 3)
        w1 = _U64(c[1]) + r
        k2 = (w1 < r).astype(_U64)
        inc = j + _U64(1)                          # 1 + j: < 2**64 for blocks < 2**64 - 1
        w0 = _U64(c[0]) + inc
        k1 = (w0 < inc).astype(_U64)
        w1b = w1 + k1
        k2 = k2 + ((w1b == 0) & (k1 == 1)).astype(_U64)
        w2 = _U64(c[2]) + k2
        k3 = (w2 < k2).astype(_U64)
        w3 = _U64(c[3]) + k3
    shape = (rows, blocks)
    return np.stack([np.broadcast_to(w, shape) for w in (w0, w1b, w2, w3)], axis=-1)


def raw_rows(key, counter: int, rows: int, n: int, first_block: int = 0) -> np.ndarray:
    """``n`` raw words of each of ``rows`` consecutive shard streams, ``(rows, n)``.

    Row ``r`` equals ``numpy.random.Philox(key=key, counter=counter + (r << 64)).random_raw(n)``
    after skipping ``first_block`` blocks (``4 * first_block`` words).
    """
    if rows < 0 or n < 0:
        raise InputError("rows, n", (rows, n), "non-negative sizes")
    blocks = -(-n // 4)
    out = philox4x64(block_counters(counter, rows, blocks, first_block), key)
    return out.reshape(rows, blocks * 4)[:, :n]


def raw_stream(key, counter: int, n: int) -> np.ndarray:
    """``numpy.random.Philox(key=key, counter=counter).random_raw(n)``, computed directly."""
    return raw_rows(key, counter, 1, n)[0]
