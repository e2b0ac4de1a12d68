"""Stores written before the durability layer still load: a real store written by the code of
commit 84ff875 (tests/montecarlo/data/make_store_v1.py wrote it), read by today's readers.

Its runs are addressed by content-address scheme 1 (the pipeline's source text); today's jobs
by scheme 2 (its code object). The old runs are still checked, replayed and verified against
the job's scheme-1 description; running the job again is a new run, to the same bits."""
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import StoreError
from dask_research.montecarlo.store.manifest import check_manifest
from dask_research.montecarlo.verify import states_match
from dask_research.testing.processes import subprocess_env

DATA = Path(__file__).with_name("data") / "store_v1"
MOMENTS_RUN = "b282d9ca5ef30bad9fc0a4b5a29fe0accf209646e826c84dcf0921ac809d1ee1"
MOMENTS_MEAN = float.fromhex("0x1.eadadb432d1e8p-1")
REDUCER_RUN = "38a1b99b5c44a4032dfc1eeee76ec60da31d73e5e3e4a27db53bab0827f50b5f"


def compat_pipe(a, b):
    return np.tanh(a * b)


class Count:    # the reducer of make_store_v1.py, with the same source text
    def init(self):
        return {"n": 0, "s": 0.0}

    def update(self, state, y):
        return {"n": state["n"] + len(y), "s": state["s"] + float(np.sum(y))}

    def merge(self, a, b):
        return {"n": a["n"] + b["n"], "s": a["s"] + b["s"]}

    def finalize(self, state):
        return state["s"] / state["n"]


def moments_job(**changes):
    kw = {**dict(shards=8, samples_per_shard=64, seed=11, bins=8, name="compat"), **changes}
    return mc.Job(compat_pipe, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, **kw)


def reducer_job():
    return mc.Job(compat_pipe, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, shards=4, samples_per_shard=64,
                  seed=12, reducer=Count(), name="compat-reducer")


def same_engine_or_skip(store, job):
    """The run id pins the engine's versions: another numpy cannot replay the stored runs."""
    engine = mc.RunStore(store).read_manifest(MOMENTS_RUN)["engine"]
    if engine != job.describe()["engine"]:
        pytest.skip(f"this engine ({job.describe()['engine']}) is not the one that wrote the store ({engine})")


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


def test_an_old_store_is_checked_replayed_and_verified_with_its_scheme_1_address(store):
    job, ujob = moments_job(), reducer_job()
    same_engine_or_skip(store, job)
    # this version addresses the job by its code (scheme 2); the stored run by its source (scheme 1)
    assert job.address(1) == MOMENTS_RUN != job.id and ujob.address(1) == REDUCER_RUN != ujob.id
    manifest = mc.RunStore(store).read_manifest(MOMENTS_RUN)
    check_manifest(manifest, job, "manifest.json")                  # the old description still matches
    with pytest.raises(StoreError, match="different job"):
        check_manifest(manifest, moments_job(seed=12), "manifest.json")
    assert mc.replay(MOMENTS_RUN, 5, store, job=job).match
    reports = mc.replay_many(MOMENTS_RUN[:10], store, k=3, job=job)
    assert len(reports) == 3 and all(r.match and r.run_id == MOMENTS_RUN for r in reports)
    assert mc.replay(REDUCER_RUN, 1, store, job=ujob).match
    assert mc.replay(MOMENTS_RUN, 2, store).match                  # without job=: the job built here
    with pytest.raises(StoreError, match="is not the one that ran"):
        mc.replay(MOMENTS_RUN, 2, store, job=moments_job(samples_per_shard=65))


@pytest.mark.timeout(240, method="thread")
def test_an_old_run_resumed_by_this_version_is_a_new_run_with_the_same_bits(store, client):
    job = moments_job()
    same_engine_or_skip(store, job)
    result = mc.run(job, client=client, store=store, progress=False)
    assert result.run_id == job.id != MOMENTS_RUN and result.reused_shards == 0
    rs = mc.RunStore(store)
    old, new = rs.read_shards(MOMENTS_RUN), rs.read_shards(job.id)
    assert sorted(new) == sorted(old) == list(range(8))
    assert all(states_match(old[s][0], new[s][0], "exact") is None for s in range(8))
    assert rs.read_manifest(job.id)["range"] == rs.read_manifest(MOMENTS_RUN)["range"]
    assert mc.show(None, store)["runs"] == sorted([MOMENTS_RUN, REDUCER_RUN, job.id])
    assert mc.replay(MOMENTS_RUN, 3, store, job=job).match and mc.replay(job.id, 3, store, job=job).match


_CLI = "import sys; sys.argv[0] = 'dask-research'; from dask_research.cli import main; main()"


@pytest.mark.timeout(240, method="thread")
def test_the_command_line_verifies_an_old_run_with_a_job_file(store, tmp_path):
    same_engine_or_skip(store, moments_job())
    job_file = tmp_path / "compat_job.py"
    job_file.write_text(
        "import numpy as np\n"
        "from dask_research import montecarlo as mc\n\n\n"
        "def compat_pipe(a, b):\n    return np.tanh(a * b)\n\n\n"
        "job = mc.Job(compat_pipe, {'a': mc.Normal(1.0, 0.1), 'b': mc.Normal(2.0, 0.2)}, shards=8,\n"
        "             samples_per_shard=64, seed=11, bins=8, name='compat')\n")
    cmd = [sys.executable, "-c", _CLI, "mc", "verify", MOMENTS_RUN[:12], "-k", "3", "--store", store,
           "--job", f"{job_file}:job"]
    out = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=200)
    assert out.returncode == 0 and "3 of 3 shards reproduced exactly" in out.stdout, out.stdout + out.stderr
