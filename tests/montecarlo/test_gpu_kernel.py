"""The CUDA Philox kernel: one source of constants, its text run on a CPU, and on a GPU if any.

Without a GPU the kernel's own source is still exercised: compiled as C++ with a small CUDA
shim (``__umul64hi`` from a 128-bit product, a loop over the grid) and compared with the NumPy
reference bit for bit, and compiled to PTX by ``nvcc`` where one is installed.
"""
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dask_research.montecarlo.gpu import kernel
from dask_research.montecarlo.gpu import philox_ref as ref

SHIM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
struct Dim { unsigned x; };
static Dim blockIdx, blockDim, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
}
@SOURCE@
/* usage: k key0 key1 c0 c1 c2 c3 rows n first [kind p0 p1]; prints one 64-bit hex word per value */
int main(int argc, char** argv) {
    unsigned long long v[6];
    for (int i = 0; i < 6; ++i) v[i] = strtoull(argv[1 + i], 0, 0);
    long long rows = atoll(argv[7]), n = atoll(argv[8]), first = atoll(argv[9]);
    long long blocks = (n + 3) / 4;
    int draw = argc > 10;
    unsigned long long* out = (unsigned long long*)calloc((size_t)(rows * n + 1), 8);
    blockDim.x = @THREADS@;
    long long total = rows * blocks, grid = (total + blockDim.x - 1) / blockDim.x;
    for (long long b = 0; b < grid; ++b)
        for (unsigned t = 0; t < blockDim.x; ++t) {
            blockIdx.x = (unsigned)b; threadIdx.x = t;
            if (draw)
                @DRAW@(v[0], v[1], v[2], v[3], v[4], v[5], rows, blocks, n, first,
                       atoi(argv[10]), strtod(argv[11], 0), strtod(argv[12], 0), (double*)out);
            else
                @NAME@(v[0], v[1], v[2], v[3], v[4], v[5], rows, blocks, n, first, out);
        }
    for (long long i = 0; i < rows * n; ++i) printf("%016llx\n", out[i]);
    return 0;
}
"""


def test_kernel_constants_come_from_the_reference():
    src = kernel.SOURCE
    assert "@" not in src
    consts = {int(h, 16) for h in re.findall(r"0x([0-9A-Fa-f]{16})ull", src)}
    assert consts == {ref.M0, ref.M1, ref.W0, ref.W1}
    assert f"rd < {ref.ROUNDS};" in src
    assert src.count("__umul64hi(") == 2                    # in the one block function
    assert f"void {kernel.KERNEL_NAME}(" in src and f"void {kernel.DRAW_KERNEL_NAME}(" in src
    floats = {float(f) for f in re.findall(r"\b\d\.\d{6,}(?:e-\d+)?\b", src)}
    assert floats == {2.0**-53, 2.0 * math.pi}             # the doubles draws.py uses


def test_importing_the_gpu_package_needs_no_cupy_and_a_gpu_call_says_why_it_cannot_run():
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import numpy as np\n"
            "from dask_research.montecarlo import gpu\n"
            "from dask_research.montecarlo.gpu import kernel\n"
            "assert kernel.cupy_or_none() is None\n"
            "try:\n"
            "    kernel.raw_rows_cupy(np.array([1, 2], dtype=np.uint64), 0, 1, 4)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ResearchError") and "cupy-cuda12x" in out.stdout


# Its tests share a module-scoped fixture: under -n they run on one worker, which builds it once.
pytestmark = pytest.mark.xdist_group("gpu_kernel")


@pytest.fixture(scope="module")
def cpu_kernel(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the kernel source on the CPU")
    d = tmp_path_factory.mktemp("kernel")
    (d / "k.cpp").write_text(SHIM.replace("@SOURCE@", kernel.SOURCE)
                             .replace("@THREADS@", str(kernel.THREADS))
                             .replace("@NAME@", kernel.KERNEL_NAME)
                             .replace("@DRAW@", kernel.DRAW_KERNEL_NAME))
    # -ffp-contract=off: no fused multiply-add, as the kernels are compiled (--fmad=false)
    subprocess.run([cxx, "-O1", "-ffp-contract=off", "-o", str(d / "k"), str(d / "k.cpp"), "-lm"],
                   check=True, timeout=120, capture_output=True)
    return d / "k"


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("key, counter, rows, n", [
    ((0, 0), 0, 1, 8),
    ((2026, 7), 5 << 64, 3, 13),                        # partial last block per row
    ((2**64 - 1, 2**64 - 1), 2**64 - 2, 2, 9),          # carry from word 0 into word 1
    ((123, 456), ((2**64 - 1) << 64) | (2**64 - 2), 3, 5),   # carries into words 2 and 3
    ((9, 9), 2**256 - 2, 2, 12),                        # wraps modulo 2**256 like numpy
    ((31, 41), 1 << 128, 70, 30),                       # more threads than one CUDA block
    ((5, 6), 2**64 - 3, 1, 16),                         # skipping 3 blocks crosses word 0
])
def test_the_kernel_source_run_on_the_cpu_equals_the_reference(cpu_kernel, key, counter, rows, n):
    got = run_kernel(cpu_kernel, key, counter, rows, n)
    np.testing.assert_array_equal(got, ref.raw_rows(np.array(key, dtype=np.uint64), counter, rows, n))
    np.testing.assert_array_equal(got[0], np.random.Philox(
        key=np.array(key, dtype=np.uint64), counter=counter).random_raw(n))
    skip = run_kernel(cpu_kernel, key, counter, rows, n, first=3)     # 3 blocks in
    np.testing.assert_array_equal(skip, ref.raw_rows(np.array(key, dtype=np.uint64), counter, rows,
                                                     n + 12)[:, 12:])


def run_kernel(exe, key, counter, rows, n, first=0, draw=()):
    c = ref.counter_words(counter)
    args = [str(v) for v in (*key, *c)] + [str(rows), str(n), str(first)] + [repr(a) for a in draw]
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    words = np.array([int(w, 16) for w in out], dtype=np.uint64).reshape(rows, n)
    return words.view(np.float64) if draw else words


@pytest.mark.timeout(120, method="thread")
def test_the_draw_kernel_run_on_the_cpu_matches_the_numpy_portable_draws(cpu_kernel):
    from dask_research import montecarlo as mc
    from dask_research.montecarlo.gpu import draws

    key = np.array([2026, 7], dtype=np.uint64)
    inputs = {"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.2, 0.3), "c": mc.Uniform(-1.0, 3.0)}
    n, rows, first = 1001, 3, 5
    want = draws.draw_rows(inputs, key, first, rows, n)
    at = 0
    for name, dist in inputs.items():
        kind, p0, p1 = draws._fused(dist)
        got = run_kernel(cpu_kernel, key, first << 64, rows, n, first=at // 4,
                         draw=(kernel.DRAW_KINDS[kind], p0, p1))
        at += draws.words_per_shard({name: dist}, n)
        if kind == "uniform":
            np.testing.assert_array_equal(got, want[name])      # integer steps and one mul+add
        else:                                                   # libm vs numpy's log/cos/sin/exp
            np.testing.assert_allclose(got, want[name], rtol=1e-14, atol=1e-14)


@pytest.mark.timeout(300, method="thread")
def test_the_kernel_compiles_to_ptx_for_hopper(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed here")
    (tmp_path / "k.cu").write_text(kernel.SOURCE)
    subprocess.run([nvcc, "-ptx", "-arch=sm_90", *kernel.OPTIONS, "-o", str(tmp_path / "k.ptx"),
                    str(tmp_path / "k.cu")], check=True, timeout=280, capture_output=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert f".entry {kernel.KERNEL_NAME}(" in ptx and f".entry {kernel.DRAW_KERNEL_NAME}(" in ptx
    assert ptx.count("mul.hi.u64") == 2 * 2 * ref.ROUNDS   # unrolled: two per round, two kernels


def _cupy():
    cp = kernel.cupy_or_none()
    if cp is None:
        pytest.skip("needs CuPy and a CUDA device (pip install cupy-cuda12x)")
    return cp


@pytest.mark.gpu
@pytest.mark.parametrize("shard", [0, 1, 317, 2**64 - 2])
def test_gpu_raw_stream_equals_numpy_philox(shard):
    _cupy()
    key = np.array([0x243F6A8885A308D3, 0x13198A2E03707344], dtype=np.uint64)
    got = kernel.raw_rows_cupy(key, shard << 64, 2, 4099).get()
    np.testing.assert_array_equal(got, ref.raw_rows(key, shard << 64, 2, 4099))
    np.testing.assert_array_equal(got[0], np.random.Philox(key=key, counter=shard << 64).random_raw(4099))


@pytest.mark.gpu
def test_gpu_block_agrees_with_its_cpu_rerun_within_the_class():
    cp = _cupy()
    from dask_research import montecarlo as mc
    from dask_research.montecarlo.gpu import compare, compute_block_portable

    def sat(a, b, c, d, e, f, g):
        t3 = np.tanh(1.5 * (a * b / (c + 1)))
        return (t3 + 0.1 * np.log1p(np.abs(d)) * e) / (1 + np.exp(-f)) + 0.01 * g

    mu, sd = [1.0, 2.0, 0.5, 3.0, 0.8, 0.2, 0.0], [0.1, 0.3, 0.05, 0.4, 0.1, 0.3, 1.0]
    job = mc.Job(sat, {n: mc.Normal(m, s) for n, m, s in zip("abcdefg", mu, sd)}, shards=16,
                 samples_per_shard=65_536, seed=2026, bins=256, range=(-0.5, 1.5), device="gpu")
    red = job.make_reducer()
    gpu = compute_block_portable(job, red, 0, 16, xp=cp)
    cpu = compute_block_portable(job, red, 0, 16, xp=np)
    for s in range(16):
        assert compare(gpu.shard_states[s], cpu.shard_states[s]) is None, s


@pytest.mark.gpu
def test_gpu_draws_match_the_numpy_portable_draws():
    cp = _cupy()
    from dask_research import montecarlo as mc
    from dask_research.montecarlo.gpu import draws

    key = np.array([2026, 7], dtype=np.uint64)
    inputs = {"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.2, 0.3), "c": mc.Uniform(-1.0, 3.0),
              "t": mc.Triangular(0.0, 1.0, 3.0),
              ("x", "y"): mc.MultivariateNormal([0, 1], [[1, .5], [.5, 2]])}
    want = draws.draw_rows(inputs, key, 5, 3, 1001)
    got = draws.draw_rows(inputs, key, 5, 3, 1001, xp=cp)
    for name in want:
        np.testing.assert_allclose(got[name].get(), want[name], rtol=1e-13, atol=1e-13, err_msg=name)
    np.testing.assert_array_equal(got["c"].get(), want["c"])
    raw = kernel.raw_rows_cupy(key, 5 << 64, 2, 10, first_block=3).get()
    np.testing.assert_array_equal(raw, ref.raw_rows(key, 5 << 64, 2, 22)[:, 12:])
