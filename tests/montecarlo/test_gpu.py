"""Device (portable) Monte-Carlo shards, tested on CPU with xp=numpy standing in for CuPy."""
import math

import numpy as np
import pytest
from distributed.utils_test import gen_cluster

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError, PipelineError, ResearchError
from dask_research.montecarlo.accumulators import Moments
from dask_research.montecarlo.gpu import (
    GPU_TOLERANCE,
    compare,
    compute_block_portable,
    compute_shard_portable,
    draw_rows,
    row_moments,
    select_xp,
    states_match,
    submit_kwargs,
    tolerance_of,
)
from dask_research.montecarlo.gpu.draws import box_muller, words_per_shard
from dask_research.montecarlo.mergers import compare_states
from dask_research.montecarlo.tree import tree_fold

from .conftest import MU, SD, saturating

KEY = np.array([0x243F6A8885A308D3, 0x13198A2E03707344], dtype=np.uint64)


def gpu_job(shards=12, n=2048, device="gpu", **kw):
    return mc.Job(saturating, {k: mc.Normal(m, s) for k, m, s in zip("abcdefg", MU, SD)},
                  shards=shards, samples_per_shard=n, seed=2026, bins=64, range=(-0.5, 1.5),
                  device=device, **kw)


# --- portable draws -------------------------------------------------------------------------
@pytest.mark.parametrize("dist", [
    mc.Normal(1.0, 2.0), mc.LogNormal(0.2, 0.4), mc.Uniform(-1.0, 3.0),
    mc.Triangular(0.0, 1.0, 3.0), mc.Triangular(0.0, 0.0, 1.0),
])
def test_portable_draws_have_the_distribution_s_mean_and_variance(dist):
    n = 200_001
    x = draw_rows({"x": dist}, KEY, 5, 1, n)["x"][0]
    assert x.shape == (n,) and np.isfinite(x).all()
    mean, var = float(dist.mean()[0]), float(dist.cov()[0, 0])
    assert abs(x.mean() - mean) < 6 * math.sqrt(var / n)
    assert abs(x.var() / var - 1) < 0.03


def test_portable_correlated_block_and_fixed_inputs():
    cov = [[1.0, 0.6], [0.6, 4.0]]
    d = draw_rows({("b", "c"): mc.MultivariateNormal([1.0, -2.0], cov), "f": mc.Fixed(3.5)},
                  KEY, 0, 1, 100_000)
    np.testing.assert_allclose(np.cov(d["b"][0], d["c"][0]), cov, rtol=0.05)
    assert (d["f"] == 3.5).all()


def test_box_muller_is_finite_at_the_extreme_words():
    w = np.array([[0, 2**64 - 1, 0, 2**64 - 1]], dtype=np.uint64)
    z = box_muller(w)
    assert np.isfinite(z).all() and z[0, 0] == 0.0      # word 0 -> a = 1 -> r = 0
    assert abs(z[0, 1]) < 9                              # largest word -> a = 2**-53


def test_layout_is_fixed_a_fixed_input_draws_nothing_and_blocks_split_anywhere():
    ins = {"a": mc.Normal(0, 1), "u": mc.Uniform(0, 1)}
    with_fixed = {"a": mc.Normal(0, 1), "k": mc.Fixed(2.0), "u": mc.Uniform(0, 1)}
    assert words_per_shard(ins, 7) == words_per_shard(with_fixed, 7) == 16
    x, y = draw_rows(ins, KEY, 3, 4, 7), draw_rows(with_fixed, KEY, 3, 4, 7)
    for k in ins:
        np.testing.assert_array_equal(x[k], y[k])
        for r in range(4):
            np.testing.assert_array_equal(x[k][r], draw_rows(ins, KEY, 3 + r, 1, 7)[k][0])


# --- Job(device=) ---------------------------------------------------------------------------
def test_device_is_checked_and_inputs_without_a_portable_draw_are_refused():
    with pytest.raises(InputError, match="device.*'tpu'.*'cpu', 'gpu', 'any'"):
        gpu_job(device="tpu")
    with pytest.raises(InputError, match=r"input 'x'.*TruncatedNormal.*Normal, LogNormal"):
        mc.Job(lambda x: x, {"x": mc.TruncatedNormal(0, 1, 0, 2)}, shards=2,
               samples_per_shard=8, device="gpu")
    mc.Job(lambda x: x, {"x": mc.TruncatedNormal(0, 1, 0, 2)}, shards=2, samples_per_shard=8)


def test_the_address_records_the_draw_algorithm_not_the_device():
    cpu = gpu_job(device="cpu")
    assert "draws" not in cpu.describe()                         # CPU ids are unchanged
    assert cpu.id == gpu_job(device="cpu").replace(device="cpu").id
    assert gpu_job(device="gpu").id == gpu_job(device="any").id != cpu.id
    d = gpu_job().describe()["draws"]
    assert d["tolerance"] == GPU_TOLERANCE and "box-muller" in d["algorithm"]
    assert gpu_job().replace(seed=3).device == "gpu"


def test_resources_tolerance_and_namespace_follow_the_device():
    assert submit_kwargs(gpu_job()) == {"resources": {"GPU": 1}}
    assert submit_kwargs(gpu_job(device="any")) == {} == submit_kwargs(gpu_job(device="cpu"))
    assert tolerance_of(gpu_job()) == GPU_TOLERANCE and tolerance_of(gpu_job(device="cpu")) == "exact"
    assert select_xp(gpu_job(), prefer="cpu") is np
    assert select_xp(gpu_job(device="cpu")) is np


def test_a_pipeline_may_take_the_namespace_as_xp():
    seen = []

    def f(a, xp):
        seen.append(xp)
        return xp.tanh(a)

    job = mc.Job(f, {"a": mc.Normal(0, 1)}, shards=3, samples_per_shard=64, range=(-1, 1),
                 device="any")
    compute_block_portable(job, job.make_reducer(), 0, 3, xp=np)
    assert seen == [np]
    with pytest.raises(InputError, match="missing \\['xp'\\]"):     # cpu jobs never pass xp
        mc.Job(f, {"a": mc.Normal(0, 1)}, shards=3, samples_per_shard=64)


def test_a_non_finite_output_names_the_shard_inside_a_block():
    def f(a):
        out = np.tanh(a)
        out[2 * 64 + 7] = np.nan            # row 2 of the flattened block 4..7: shard 6
        return out

    job = mc.Job(f, {"a": mc.Normal(0, 1)}, shards=8, samples_per_shard=64, range=(-1, 1),
                 device="any")
    with pytest.raises(PipelineError, match="shard 6.*1 of 64.*nan.*sample 7"):
        compute_block_portable(job, job.make_reducer(), 4, 8, xp=np)


# --- one algorithm, any block split ---------------------------------------------------------
def test_block_states_equal_single_shard_reruns_and_from_samples_exactly_on_cpu():
    job = gpu_job()
    red = job.make_reducer()
    blk = compute_block_portable(job, red, 2, 9, known={4: compute_shard_portable(job, 4)}, xp=np)
    assert blk.computed == [2, 3, 5, 6, 7, 8]
    for s in range(2, 9):
        one = compute_shard_portable(job, s)
        assert blk.shard_states[s] == one
        y = saturating(**{k: v[0] for k, v in draw_rows(job.inputs, job.key, s, 1, 2048).items()})
        assert Moments.from_samples(y, job.range, job.bins) == one
    assert blk.state == tree_fold(red.merge, [blk.shard_states[s] for s in range(2, 9)])


# --- the tolerance class --------------------------------------------------------------------
def _ulps(y, k, seed):
    """``y`` with every value moved by up to ``k`` ulps (what libdevice vs libm can do)."""
    steps = np.random.default_rng(seed).integers(-k, k + 1, y.size)
    return y + steps * np.spacing(np.abs(y))


def test_compare_accepts_float_differences_and_refuses_real_ones():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(32_768)
    y = np.concatenate([x, -x])                      # symmetric: mean and m3 are rounding noise
    a = Moments.from_samples(y, (-5.0, 5.0), 256)
    for seed in range(5):
        b = Moments.from_samples(rng.permutation(_ulps(y, 8, seed)), (-5.0, 5.0), 256)
        assert compare(b, a) is None
    # naive per-field rtol would call cancellation noise a difference; the class does not
    b = Moments.from_samples(rng.permutation(_ulps(y, 8, 0)), (-5.0, 5.0), 256)
    assert compare_states(b, a, rtol=1e-12) is not None
    one = y.copy()
    one[123] += 1e-6                                 # a single wrong sample
    assert "mean" in compare(Moments.from_samples(one, (-5.0, 5.0), 256), a)
    shifted = Moments.from_samples(y * (1 + 1e-9), (-5.0, 5.0), 256)
    assert compare(shifted, a) is not None
    assert "edges" in compare(Moments.from_samples(y, (-5.0, 5.0), 4), a)
    h = a.hist.copy()
    h[100], h[101] = h[100] - 3, h[101] + 3          # three samples across one edge
    assert "hist" in compare(Moments(**{**a.__dict__, "hist": h}), a)
    h = a.hist.copy()
    h[100], h[101] = h[100] - 1, h[101] + 1          # one: a sample within rtol of an edge
    assert compare(Moments(**{**a.__dict__, "hist": h}), a) is None
    assert states_match(b, a, GPU_TOLERANCE) is None
    assert states_match(b, a, "exact") is not None


def test_row_moments_is_from_samples_row_by_row():
    y = np.random.default_rng(2).normal(0.3, 1.0, (5, 999))
    rows = row_moments(y, (-2.0, 2.0), 16)
    for r in range(5):
        assert rows[r] == Moments.from_samples(y[r], (-2.0, 2.0), 16)


# --- end to end on a cluster with a "GPU" worker (numpy standing in for CuPy) ---------------
@pytest.mark.timeout(120, method="thread")
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1, {"resources": {"GPU": 1}}), ("127.0.0.1", 1)])
async def test_gpu_shards_run_on_gpu_workers_and_cpu_verification_accepts_within_the_class(
        c, s, gpu_w, cpu_w):
    job = gpu_job(shards=12)
    red = job.make_reducer()
    futs = [c.submit(compute_block_portable, job, red, a, a + 4, xp=np, pure=False,
                     **submit_kwargs(job)) for a in range(0, 12, 4)]
    blocks = await c.gather(futs)
    assert {b.worker for b in blocks} == {gpu_w.address}         # only the GPU worker took them
    states = {k: v for b in blocks for k, v in b.shard_states.items()}
    root = tree_fold(red.merge, [states[i] for i in range(12)])
    whole = compute_block_portable(job, red, 0, 12, xp=np)
    assert root == whole.state

    # verification: CPU re-runs on the other worker, compared in the job's class
    checks = await c.gather([c.submit(compute_shard_portable, job, i, red, pure=False,
                                      workers=[cpu_w.address], allow_other_workers=False)
                             for i in (0, 5, 11)])
    for i, chk in zip((0, 5, 11), checks):
        assert states_match(states[i], chk, tolerance_of(job)) is None

    # a worker whose floats differ by a few ulps passes; one that is wrong is caught
    def ulps(worker, shard, y):
        return _ulps(y, 4, shard)

    def wrong(worker, shard, y):
        y = y.copy()
        y[0] += 1e-3
        return y

    fuzzy, bad = await c.gather([
        c.submit(compute_block_portable, job, red, 4, 8, tamper=t, xp=np, pure=False,
                 **submit_kwargs(job)) for t in (ulps, wrong)])
    assert states_match(fuzzy.shard_states[5], checks[1], tolerance_of(job)) is None
    assert states_match(fuzzy.shard_states[5], checks[1], "exact") is not None
    assert states_match(bad.shard_states[5], checks[1], tolerance_of(job)) is not None

    # a worker that advertises a GPU it cannot use says so (no CuPy here)
    if select_xp(gpu_job(device="any")) is np:
        with pytest.raises(ResearchError, match="no usable CuPy"):
            await c.submit(compute_block_portable, job, red, 0, 1, pure=False, **submit_kwargs(job))


def test_the_engine_dispatch_keeps_cpu_jobs_on_the_ordinary_path():
    from dask_research.montecarlo.gpu import block_function, recompute_shard
    from dask_research.montecarlo.shard_compute import compute_block, compute_shard

    cpu, dev = gpu_job(device="cpu"), gpu_job(device="any")
    assert block_function(cpu) is compute_block and block_function(dev) is compute_block_portable
    assert recompute_shard(cpu, 3) == compute_shard(cpu, 3)             # bit-identical, as today
    assert recompute_shard(dev, 3) == compute_shard_portable(dev, 3)
    assert recompute_shard(dev, 3) != compute_shard(cpu, 3)             # another algorithm


def test_a_job_rebuilt_from_its_description_keeps_its_address():
    from dask_research.montecarlo.gpu.device_choice import device_of_description

    for device in ("cpu", "gpu", "any"):
        job = gpu_job(device=device)
        again = job.replace(device=device_of_description(job.describe()))
        assert again.id == job.id


@pytest.mark.parametrize("device", ["gpu", "any"])
def test_mc_run_refuses_a_device_job_in_one_line_before_anything_runs(device, tmp_path):
    """The run engine draws with the ordinary path only: a device job ran quietly on the CPU with
    numpy's ziggurat draws while its address (and its store) recorded the portable algorithm."""
    job = gpu_job(device=device)
    with pytest.raises(InputError) as e:
        mc.run(job, client=None, store=str(tmp_path / "store"), progress=False)
    text = str(e.value)
    assert "\n" not in text and f"device={device!r} is invalid" in text and "docs/gpu.rst" in text
    assert not (tmp_path / "store").exists()          # nothing half-written
