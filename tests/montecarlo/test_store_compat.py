"""Stores written before the durability layer still load: a real store written by the code of
commit 84ff875 (tests/montecarlo/data/make_store_v1.py wrote it), read by today's readers."""
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from dask_research import montecarlo as mc

DATA = Path(__file__).with_name("data") / "store_v1"
MOMENTS_RUN = "b282d9ca5ef30bad9fc0a4b5a29fe0accf209646e826c84dcf0921ac809d1ee1"
MOMENTS_MEAN = float.fromhex("0x1.eadadb432d1e8p-1")
REDUCER_RUN = "38a1b99b5c44a4032dfc1eeee76ec60da31d73e5e3e4a27db53bab0827f50b5f"


def compat_pipe(a, b):
    return np.tanh(a * b)


@pytest.fixture
def store(tmp_path):
    shutil.copytree(DATA, tmp_path / "store")
    return str(tmp_path / "store")


def test_an_old_store_lists_shows_and_recomputes_its_runs(store):
    assert mc.show(None, store)["runs"] == sorted([MOMENTS_RUN, REDUCER_RUN])
    info = mc.show(MOMENTS_RUN[:10], store)
    assert info["complete"] and info["stored_shards"] == 8 and info["name"] == "compat"
    res = info["result"]
    assert res["result_checked"] and "result_mismatch" not in res and res["n"] == 512
    assert math.isclose(res["mean"], MOMENTS_MEAN, rel_tol=1e-12)
    assert res["verification"]["checks"] == 2 and res["verification"]["reused_checked"] == []
    user = mc.show(REDUCER_RUN, store)
    assert user["complete"] and user["result"]["result_checked"] is False and user["result"]["mean"] is None


def test_an_old_store_reads_whole_through_the_run_store(store):
    rs = mc.RunStore(store)
    manifest = rs.read_manifest(MOMENTS_RUN)
    assert manifest["range"] == [0.87, 1.0190000000000001] and manifest["job"]["partitioning"]["shards"] == 8
    stored = rs.read_shards(MOMENTS_RUN)
    assert sorted(stored) == list(range(8)) and all(isinstance(s, mc.Moments) for s, _, _ in stored.values())
    assert rs.read_result(MOMENTS_RUN)["mean"] == MOMENTS_MEAN
    assert sorted(rs.read_shards(REDUCER_RUN)) == [0, 1, 2, 3]


def test_an_old_store_resumes_and_replays_when_the_engine_is_the_same(store):
    job = mc.Job(compat_pipe, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, shards=8,
                 samples_per_shard=64, seed=11, bins=8, name="compat")
    if job.id != MOMENTS_RUN:       # the run id pins the engine's versions: another numpy is another run
        manifest = mc.RunStore(store).read_manifest(MOMENTS_RUN)
        assert manifest["engine"] != job.describe()["engine"]
        pytest.skip(f"this engine ({job.describe()['engine']}) is not the one that wrote the store")
    held = mc.RunStore(store).holdings(job)
    assert held.status == "complete" and held.range == (0.87, 1.0190000000000001)
    assert mc.replay(MOMENTS_RUN, 5, store, job=job).match
