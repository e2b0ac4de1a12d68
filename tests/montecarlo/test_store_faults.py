"""Faults of the run store on real files: links, a full disk, edited or foreign files, lost manifests,
store paths that do not exist or cannot be created."""
import json
import os
import pathlib
import subprocess
import uuid

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import StoreError
from dask_research.montecarlo.store import StoreWarning, checksum
from dask_research.testing.processes import wait_for

from .test_store import job_module, one_worker  # noqa: F401 - fixtures


def _run_dir(store, job):
    return pathlib.Path(store) / "runs" / job.id


def _run(job, client, store, **kw):
    return mc.run(job, client=client, store=str(store), progress=False, **kw)


# -- symbolic links --------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["runs", "run", "shards", "file"])
def test_writes_never_follow_a_link_inside_the_store(tmp_path, job_module, one_worker, link):
    _, job = job_module
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (store / "runs").mkdir(parents=True)
    run_dir = store / "runs" / job.id
    if link == "runs":
        (store / "runs").rmdir()
        (store / "runs").symlink_to(outside)
        bad = store / "runs"
    elif link == "run":
        run_dir.symlink_to(outside)
        bad = run_dir
    elif link == "shards":
        run_dir.mkdir()
        (run_dir / "shards").symlink_to(outside)
        bad = run_dir / "shards"
    else:  # a planted link where the result will go: writing would overwrite its target
        run_dir.mkdir()
        target = outside / "victim.txt"
        target.write_text("precious")
        bad = run_dir / "result.json"
        bad.symlink_to(target)
    with pytest.raises(StoreError, match="is a symbolic link; links inside it are refused, never followed") as err:
        _run(job, one_worker, store, shards_per_task=4, verify=0)
    assert str(bad) in str(err.value)
    assert [p.name for p in outside.iterdir()] in ([], ["victim.txt"])
    if link == "file":
        assert (outside / "victim.txt").read_text() == "precious"


def test_a_store_whose_root_is_a_link_is_read_and_still_checked(tmp_path, job_module, one_worker):
    """The root may be a link (where you chose to put the store); links inside it are refused."""
    _, job = job_module
    real = tmp_path / "real"
    _run(job, one_worker, real, verify=0)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert mc.show(job.id[:8], str(link))["complete"]
    assert mc.replay(job.id, 3, str(link), job=job).match


# -- a full disk -----------------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip() or res.returncode}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.timeout(180, method="thread")
def test_a_full_disk_names_the_path_leaves_no_temporary_file_and_resumes(tmp_path, tiny_fs, job_module, one_worker):
    _, job = job_module
    store = tiny_fs / "store"
    # Fill the file system so that the manifest fits but the shard files do not.
    store.mkdir()
    ballast = tiny_fs / "ballast"
    with pytest.raises(StoreError, match=r"could not be written \(No space left on device \[ENOSPC\]\)") as err:
        rs = mc.RunStore(str(store))
        rs.prepare()
        ballast.write_bytes(b"\0" * (64 * 1024 - 20 * 1024))
        _run(job, one_worker, store, shards_per_task=4, verify=0)
    assert "shards/0000000000" in str(err.value) or "manifest.json" in str(err.value)
    # A block task already writing on the worker when the run failed finishes its own write
    # there (Dask cannot stop a running task) and removes its temporary file when that fails
    # too: none stays, though one may still exist for a moment after the run has raised.
    wait_for(lambda: not [p for p in tiny_fs.rglob("*") if ".tmp-" in p.name], 60,
             "the temporary files under the store to go")
    ballast.unlink()
    first = _run(job, one_worker, store, shards_per_task=4, verify=0)    # the same call resumes
    assert first.n == job.total_samples
    assert mc.show(job.id, str(store))["complete"]


# -- edited accumulators -----------------------------------------------------------------------
def _edit_first_shard(store, job, edit):
    path = sorted((_run_dir(store, job) / "shards").iterdir())[0]
    doc = json.loads(path.read_text())
    key = sorted(doc["states"])[0]
    edit(doc["states"][key]["__moments__"])
    doc["checksum"] = checksum(doc["states"])
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(mean=float("nan").hex()), "non-finite mean=nan"),
    (lambda m: m.update(m2=(-1.0).hex()), "m2=-1.0 is negative"),
    (lambda m: m.update(m4=float("inf").hex()), "non-finite m4=inf"),
    (lambda m: m.update(n=-5), "n=-5 is negative"),
    (lambda m: m["hist"].__setitem__(0, m["hist"][0] + 1), "histogram counts \\+ underflow \\+ overflow"),
    (lambda m: m.update(min=(10.0).hex(), max=(1.0).hex()), "not finite min <= max"),
])
def test_an_edited_accumulator_with_a_recomputed_checksum_is_refused(tmp_path, job_module, one_worker, edit, match):
    _, job = job_module
    store = tmp_path / "store"
    _run(job, one_worker, store, shards_per_task=8, verify=0)
    path = _edit_first_shard(store, job, edit)
    for call in (lambda: _run(job, one_worker, store, verify=0),
                 lambda: mc.show(job.id, str(store)),
                 lambda: mc.replay(job.id, 0, str(store), job=job)):
        with pytest.raises(StoreError, match=match) as err:
            call()
        assert path.name in str(err.value)


def test_the_same_check_applies_to_any_decoded_state():
    from dask_research.montecarlo.codec import CodecError, decode, encode

    m = mc.Moments.from_samples(np.linspace(0.0, 1.0, 100), (0.0, 1.0), 4)
    doc = encode({"inner": (m, 1)})
    doc["inner"]["__tuple__"][0]["__moments__"]["m2"] = float("nan").hex()
    with pytest.raises(CodecError, match="non-finite m2=nan"):
        decode(doc)
    assert decode(encode({"inner": (m, 1)}))["inner"][0] == m


# -- foreign files -----------------------------------------------------------------------------
def test_foreign_files_in_shards_are_ignored_with_one_warning(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    full = _run(job, one_worker, store, shards_per_task=8, verify=0)
    shards = _run_dir(store, job) / "shards"
    first = sorted(shards.iterdir())[0]
    for name in (".DS_Store", first.name + "~", "." + first.name + ".swp", "notes.txt"):
        (shards / name).write_bytes(b"\x00\x01 not ours")
    (shards / "000000000008-000000000016.json").unlink()
    with pytest.warns(StoreWarning, match="not a shard file") as rec:
        again = _run(job, one_worker, store, verify=0)
    assert again.state == full.state and again.computed_shards == 8
    assert len({str(w.message) for w in rec}) == 4
    with pytest.warns(StoreWarning) as rec2:  # once per name: a second read is quiet
        import warnings

        warnings.warn("sentinel", StoreWarning, stacklevel=1)
        mc.show(job.id, str(store))
    assert [str(w.message) for w in rec2] == ["sentinel"]
    # A file that claims to be a shard file and is not: refused, naming it.
    (shards / "0-8.json").write_text("{}")
    with pytest.raises(StoreError, match="0-8.json: is named like a shard file"):
        mc.show(job.id, str(store))


# -- overlapping shard files ---------------------------------------------------------------------
def test_overlapping_shard_files_identical_accepted_conflicting_refused(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    full = _run(job, one_worker, store, shards_per_task=4, verify=0)
    rs = mc.RunStore(str(store))
    stored = rs.read_shards(job.id)
    rs.write_shards(job.id, {s: stored[s][0] for s in range(8)}, "other-writer")   # 0-8 over 0-4 and 4-8
    again = _run(job, one_worker, store, verify=0)
    assert again.state == full.state and again.computed_shards == 0
    # The same file written twice (a second writer with equal task size): idempotent.
    rs.write_shards(job.id, {s: stored[s][0] for s in range(8)}, "third-writer")
    s3 = stored[3][0]
    bad = mc.Moments(s3.n, s3.mean + 1e-9, s3.m2, s3.m3, s3.m4, s3.min, s3.max, s3.lo, s3.hi, s3.hist)
    with pytest.raises(StoreError, match="already exists with different states"):
        rs.write_shards(job.id, {**{s: stored[s][0] for s in range(8)}, 3: bad}, "liar")
    rs.write_shards(job.id, {**{s: stored[s][0] for s in range(2, 4)}, 3: bad}, "liar")
    with pytest.raises(StoreError, match=r"000000000002-000000000004.json: holds shard 3 with a state different "
                                         r"from the one in .*000000000000-00000000000[48].json"):
        mc.show(job.id, str(store))


# -- a deleted manifest ----------------------------------------------------------------------------
def test_a_deleted_manifest_reuses_the_valid_shards_and_is_written_again(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    full = _run(job, one_worker, store, shards_per_task=4, verify=0)
    manifest = _run_dir(store, job) / "manifest.json"
    manifest.unlink()
    (_run_dir(store, job) / "shards" / "000000000004-000000000008.json").unlink()
    again = _run(job, one_worker, store, verify=0)
    assert again.state == full.state and again.computed_shards == 4 and again.reused_shards == 20
    assert manifest.exists() and mc.show(job.id, str(store))["complete"]


def test_a_deleted_manifest_with_foreign_shards_says_what_to_delete(tmp_path, job_module, one_worker):
    _, job = job_module
    store = tmp_path / "store"
    _run(job, one_worker, store, shards_per_task=8, verify=0)
    _run_dir(store, job).joinpath("manifest.json").unlink()
    rs = mc.RunStore(str(store))
    states = {s: v[0] for s, v in rs.read_shards(job.id).items()}
    shards = _run_dir(store, job) / "shards"
    for p in shards.iterdir():
        p.unlink()
    # Shards of the same run id with another histogram range (as a different margin would give).
    # (Their histograms put the counts in the bins of min and max, so each one passes Moments.check.)
    def rebinned(m):
        blank = mc.Moments(m.n, m.mean, m.m2, m.m3, m.m4, m.min, m.max, -5.0, 5.0, 0 * m.hist)
        hist = 0 * m.hist
        hist[blank._counter_of(m.min)] += m.n - 1
        hist[blank._counter_of(m.max)] += 1
        return mc.Moments(m.n, m.mean, m.m2, m.m3, m.m4, m.min, m.max, -5.0, 5.0, hist).check()

    wrong = {s: rebinned(m) for s, m in states.items()}
    rs.write_shards(job.id, dict(list(wrong.items())[:8]), "w")
    with pytest.raises(StoreError, match="manifest is missing, so these shards cannot be reused: delete .*runs/"):
        _run(job, one_worker, store, verify=0)
    assert not (_run_dir(store, job) / "manifest.json").exists()      # nothing written on failure


# -- store paths ------------------------------------------------------------------------------------
def test_readers_say_a_store_does_not_exist(tmp_path, job_module):
    _, job = job_module
    typo = str(tmp_path / "typo")
    for call in (lambda: mc.show(None, typo), lambda: mc.show(job.id, typo),
                 lambda: mc.replay(job.id, 0, typo, job=job), lambda: mc.replay_many(job.id, typo, job=job),
                 lambda: mc.load_job(job.id, typo, job=job)):
        with pytest.raises(StoreError, match="typo: does not exist"):
            call()
    assert not os.path.exists(typo)
    with pytest.raises(StoreError, match="does not exist"):
        mc.show(None, f"memory://{uuid.uuid4().hex}")


def test_run_refuses_a_store_that_is_a_file_or_cannot_be_created_before_computing(tmp_path, job_module, monkeypatch):
    _, job = job_module
    called = []
    import sys

    monkeypatch.setattr(sys.modules["dask_research.montecarlo.run"], "_pilot", lambda j: called.append(j))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(StoreError, match="afile: is a file, not a run store"):
        mc.run(job, store=str(afile), progress=False)
    with pytest.raises(StoreError, match=r"afile/sub: cannot be created: \S*afile is a file$"):
        mc.run(job, store=str(afile / "sub"), progress=False)
    with pytest.raises(StoreError, match=r"cannot be created"):
        mc.run(job, store="/proc/no-such-store", progress=False)
    assert called == []


def test_a_store_that_is_a_dangling_link_is_named_as_one(tmp_path, job_module):
    """A store path that is a symbolic link to a missing directory was called "a file"."""
    _, job = job_module
    (tmp_path / "runs").symlink_to(tmp_path / "gone")
    with pytest.raises(StoreError, match=r"runs: is a symbolic link to .*gone, which does not exist"):
        mc.run(job, store=str(tmp_path / "runs"), progress=False)
    assert not (tmp_path / "gone").exists()
