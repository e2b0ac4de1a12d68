import json
import os
import pathlib
import pickle

import numpy as np
import pytest
from click.testing import CliRunner

from dask_research import montecarlo as mc
from dask_research.cli import main
from dask_research.exceptions import StoreError

JOB_SOURCE = '''
import numpy as np
from dask_research import montecarlo as mc


def sat(a, b, c):
    return np.tanh(a * b / (c + 1))


job = mc.Job(sat, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.3), "c": mc.Normal(0.5, 0.05)},
             shards=24, samples_per_shard=1024, seed=9, bins=32, name="stored")
'''


@pytest.fixture
def job_module(tmp_path):
    path = tmp_path / "stored_job.py"
    path.write_text(JOB_SOURCE)
    from dask_research.cli import load_object

    return path, load_object(f"{path}:job")


@pytest.fixture
def one_worker(loop):
    from distributed import Client, LocalCluster

    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


def _run_dir(store, job):
    return pathlib.Path(store) / "runs" / job.id


def test_store_layout_and_rerun_computes_nothing(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    first = mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=4)
    run_dir = _run_dir(store, job)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["job"] == job.describe() and manifest["range"] == list(first.pilot["range"])
    assert {"dask_research", "numpy", "dask", "distributed"} <= set(manifest["versions"])
    files = sorted(p.name for p in (run_dir / "shards").iterdir())
    assert files[0] == "000000000000-000000000004.json" and len(files) == 6
    assert json.loads((run_dir / "result.json").read_text())["mean"] == first.mean
    again = mc.run(job, client=one_worker, store=str(store), progress=False)
    assert again.state == first.state and again.computed_shards == 0 and again.reused_shards == 24


def test_resume_computes_only_missing_shards_with_any_task_size(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    full = mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=4)
    for name in ("000000000004-000000000008.json", "000000000016-000000000020.json"):
        (_run_dir(store, job) / "shards" / name).unlink()
    resumed = mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=16)
    assert resumed.computed_shards == 8 and resumed.reused_shards == 16
    assert resumed.state == full.state


def test_fsspec_memory_store(job_module, one_worker):
    _, job = job_module
    res = mc.run(job, client=one_worker, store="memory://mc-test-store", progress=False)
    rs = mc.RunStore("memory://mc-test-store")
    assert rs.list_runs() == [job.id] and len(rs.read_shards(job.id)) == 24
    assert mc.replay(job.id, 5, "memory://mc-test-store", job=job).match
    assert res.n == 24 * 1024


def _corrupt(path: pathlib.Path, how: str):
    raw = path.read_bytes()
    if how == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "bitflip":
        i = raw.index(b'"hist"') + 12
        path.write_bytes(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:])
    elif how == "pickle":
        class Boom:
            def __reduce__(self):
                return (os.system, ("touch " + str(path) + ".pwned",))

        path.write_bytes(pickle.dumps(Boom()))


@pytest.mark.parametrize("how, match", [
    ("truncate", "is not valid JSON"),
    ("bitflip", "checksum does not match|not valid JSON"),
    ("pickle", "is not UTF-8 text"),
])
def test_corrupt_shard_files_are_refused_naming_the_file(tmp_path, job_module, one_worker, how, match):
    _, job = job_module
    store = tmp_path / "store"
    mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=8)
    target = _run_dir(store, job) / "shards" / "000000000008-000000000016.json"
    _corrupt(target, how)
    before = sorted(p.name for p in target.parent.iterdir())
    with pytest.raises(StoreError, match=match) as err:
        mc.run(job, client=one_worker, store=str(store), progress=False)
    assert "000000000008-000000000016.json" in str(err.value)
    assert sorted(p.name for p in target.parent.iterdir()) == before  # nothing overwritten
    assert not pathlib.Path(str(target) + ".pwned").exists()          # no code ran


def test_foreign_engine_and_edited_manifest_are_refused(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    mc.run(job, client=one_worker, store=str(store), progress=False)
    path = _run_dir(store, job) / "manifest.json"
    doc = json.loads(path.read_text())
    doc["engine"]["numpy"] = "1.0.0"
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="manifest.json: checksum does not match"):
        mc.run(job, client=one_worker, store=str(store), progress=False)
    from dask_research.montecarlo.store import checksum

    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="was written by engine .*'numpy': '1.0.0'"):
        mc.run(job, client=one_worker, store=str(store), progress=False)


def test_replay_from_the_manifest_and_the_job_this_process_ran(tmp_path, job_module, one_worker):
    path, job = job_module
    store = str(tmp_path / "store")
    mc.run(job, client=one_worker, store=store, progress=False)
    report = mc.replay(job.id, 17, store)               # the job this process ran / imported
    assert report.match and report.stored == report.recomputed and "shard 17" in str(report)
    assert all(r.match for r in mc.replay_many(job.id, store, k=3))
    edited = job.replace(pipeline=lambda a, b, c: np.tanh(a * b * 1.0 / (c + 1)))
    with pytest.raises(StoreError, match="is not the one that ran"):
        mc.replay(job.id, 17, store, job=edited)
    with pytest.raises(StoreError, match="empty: does not exist"):
        mc.replay(job.id, 17, str(tmp_path / "empty"), job=job)


def test_replay_detects_a_tampered_accumulator(tmp_path, job_module, one_worker):
    _, job = job_module
    store = str(tmp_path / "store")
    mc.run(job, client=one_worker, store=store, progress=False, shards_per_task=8)
    rs = mc.RunStore(store)
    states = {s: v[0] for s, v in rs.read_shards(job.id).items() if 8 <= s < 16}
    from dask_research.montecarlo.accumulators import Moments

    s9 = states[9]
    states[9] = Moments(s9.n, s9.mean + 1e-12, s9.m2, s9.m3, s9.m4, s9.min, s9.max, s9.lo, s9.hi, s9.hist)
    (_run_dir(store, job) / "shards" / "000000000008-000000000016.json").unlink()
    rs.write_shards(job.id, states, "tampered")
    report = mc.replay(job.id, 9, store, job=job)
    assert not report.match and "mean" in report.difference


def test_cli_show_replay_verify(tmp_path, job_module, one_worker, monkeypatch):
    path, job = job_module
    store = str(tmp_path / "store")
    mc.run(job, client=one_worker, store=store, progress=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    out = runner.invoke(main, ["mc", "show", "--store", store])
    assert out.exit_code == 0 and job.id in out.output
    out = runner.invoke(main, ["mc", "show", job.id[:10], "--store", store])
    assert out.exit_code == 0 and "shards stored 24 of 24" in out.output and "verified" in out.output
    out = runner.invoke(main, ["mc", "replay", job.id[:10], "--shard", "3", "--store", store])
    assert out.exit_code == 0 and "identical (exact)" in out.output
    out = runner.invoke(main, ["mc", "replay", job.id[:10], "--shard", "3", "--store", store, "--job", f"{path}:job"])
    assert out.exit_code == 0 and "recorded it" not in out.output       # the file's job is the run's
    out = runner.invoke(main, ["mc", "verify", job.id, "--store", store, "--shards", "1,2,23"])
    assert out.exit_code == 0 and "3 of 3 shards reproduced exactly" in out.output
    out = runner.invoke(main, ["mc", "show", "ffff", "--store", store])
    assert out.exit_code == 1
    assert f"{store}: has no run starting with 'ffff' (1 run in it; mc show lists them)" in out.output
    assert "RunStore(" not in out.output
    out = runner.invoke(main, ["mc", "show", "--store", store, "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["store"] == store       # a path, not a repr
    out = runner.invoke(main, ["mc", "verify", job.id, "--store", store, "--shards", "1,x"])
    assert out.exit_code == 2 and "not a comma-separated list" in out.output


def test_store_url_credentials_are_redacted():
    from dask_research.montecarlo.store import redact

    assert redact("s3://KEY:SECRET@bucket/runs") == "s3://***@bucket/runs"
    assert "SECRET" not in repr(mc.RunStore("memory://user:SECRET@x/y"))


@pytest.mark.parametrize("args", [["mc", "show", "--store", "s3://KEY:SECRET@bucket"],
                                  ["mc", "show", "0123abcd", "--store", "gcs://user:SECRET@bucket/runs"]])
def test_a_store_that_cannot_be_opened_is_named_without_its_credentials(args):
    """The error line of a store URL (s3fs/gcsfs not installed here, or a bad bucket) printed
    the key and secret the user typed."""
    out = CliRunner().invoke(main, args)
    assert out.exit_code != 0 and "cannot be opened as a store" in out.output, out.output
    assert "SECRET" not in out.output and "//***@bucket" in out.output, out.output


def test_a_store_never_chooses_what_code_runs(tmp_path, job_module, one_worker):
    """In this process the job is found among what it ran and imported; a planted origin is not imported.

    The subprocess versions (fresh working directory, hostile file under it, __main__ scripts)
    are in tests/security/test_store_trust.py.
    """
    path, job = job_module
    store = str(tmp_path / "store")
    mc.run(job, client=one_worker, store=store, progress=False)
    evil = tmp_path / "evil.py"
    evil.write_text("import pathlib; pathlib.Path(__file__).with_suffix('.ran').write_text('x')\n"
                    "def sat(a, b, c):\n    return a\n")
    from dask_research.montecarlo.job_registry import JOBS
    from dask_research.montecarlo.store import checksum

    mpath = tmp_path / "store" / "runs" / job.id / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["origin"] = {"module": "evil_planted", "qualname": "sat", "file": str(evil)}
    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    mpath.write_text(json.dumps(doc))
    assert mc.replay(job.id, 2, store).match     # the job this process built; the planted origin is ignored
    assert not evil.with_suffix(".ran").exists()
    JOBS.clear()            # as if this process had built no job
    with pytest.raises(StoreError, match="not the pipeline of any job built in this process.*pass job=.*--trust-origin"):
        mc.replay(job.id, 2, store)
    assert not evil.with_suffix(".ran").exists()
    out = CliRunner().invoke(main, ["mc", "replay", job.id, "--shard", "2", "--store", store])
    assert out.exit_code == 2 and "--job" in out.output and "--trust-origin" in out.output   # a usage error
    assert not evil.with_suffix(".ran").exists()
    assert mc.replay(job.id, 2, store, job=job).match


def _bad_shape(a):
    return a[:3]


def test_a_run_refused_before_it_stores_anything_leaves_no_empty_store(tmp_path, one_worker):
    """A wrong pipeline is refused by its pilot; the store directories the run made for it go
    with it, and a directory that was there before (the user's own) stays."""
    from dask_research.exceptions import PipelineError

    job = mc.Job(_bad_shape, {"a": mc.Normal(0.0, 1.0)}, shards=4, samples_per_shard=1000, seed=1)
    new = tmp_path / "new" / "runs"
    with pytest.raises(PipelineError, match=r"returned shape \(3,\)"):
        mc.run(job, client=one_worker, store=str(new), progress=False)
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(PipelineError):
        mc.run(job, client=one_worker, store=str(mine), progress=False)
    assert mine.is_dir() and not any(mine.iterdir())


def test_a_store_path_that_is_a_file_is_a_usage_error(tmp_path, job_module, monkeypatch):
    path, _ = job_module
    (tmp_path / "afile").write_text("mine")
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["mc", "run", f"{path}:job", "--store", "afile", "--no-progress"])
    assert out.exit_code == 2, out.output
    assert "'afile' is a file, not a run store; give a directory (it is created if missing)" in out.output
    assert (tmp_path / "afile").read_text() == "mine"


def test_replay_says_when_it_used_the_runs_shard_count_not_the_files(tmp_path, job_module, one_worker):
    """``mc run FILE:job --shards 8`` then ``mc replay ... --job FILE:job`` (24 shards in the
    file): the shard is recomputed as the run recorded it, and the command says so."""
    path, job = job_module
    store = str(tmp_path / "store")
    res = mc.run(job.replace(shards=8), client=one_worker, store=store, progress=False)
    out = CliRunner().invoke(main, ["mc", "replay", res.run_id[:10], "--shard", "3", "--store", store,
                                    "--job", f"{path}:job"])
    assert out.exit_code == 0 and "identical (exact)" in out.output, out.output
    assert "(the job given has shards 24; recomputed as the run recorded it: shards 8)" in out.output
    out = CliRunner().invoke(main, ["mc", "verify", res.run_id, "-k", "2", "--store", store, "--job", f"{path}:job"])
    assert out.exit_code == 0 and "recomputed as the run recorded it: shards 8)" in out.output, out.output
    reseeded = mc.run(job.replace(seed=123), client=one_worker, store=store, progress=False)
    out = CliRunner().invoke(main, ["mc", "replay", reseeded.run_id[:10], "--shard", "3", "--store", store,
                                    "--job", f"{path}:job"])
    assert out.exit_code == 0 and "identical (exact)" in out.output, out.output
    assert "(the job given has seed 9; recomputed as the run recorded it: seed 123)" in out.output
